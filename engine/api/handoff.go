package api

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// The HTTP contract of a prefill/decode hand-over (docs/design.md §9).
const (
	// HeaderDecodeEngine, on a generation request to a prefill engine
	// (cb engine --role prefill), names the decode engine to hand the
	// request over to: its base URL, http://host:port. Set by the caller
	// (the gateway).
	HeaderDecodeEngine = "X-CB-Decode-Engine"
	// HeaderHandoff, on the request a prefill engine forwards to the
	// decode engine, carries the hand-over (Handoff.String). Set by the
	// prefill engine only.
	HeaderHandoff = "X-CB-Handoff"
	// HeaderKVBytes, HeaderKVBlocksSent and HeaderKVBlocksDeduped are the
	// decode engine's report of the transfer, on its answer: the bytes
	// pulled, the blocks pulled, and the blocks it already held by prefix
	// hash (not sent).
	HeaderKVBytes         = "X-CB-KV-Bytes"
	HeaderKVBlocksSent    = "X-CB-KV-Blocks-Sent"
	HeaderKVBlocksDeduped = "X-CB-KV-Blocks-Deduped"
)

// Hand-over bounds.
const (
	// HandoffSecretBytes is the length of a hand-over's secret.
	HandoffSecretBytes = 32
	// MaxHandoffHeader bounds the X-CB-Handoff header.
	MaxHandoffHeader = 1024
	// maxHandoffID bounds the request id of a hand-over.
	maxHandoffID = 128
	// maxWorkerAddr bounds the prefill worker's address.
	maxWorkerAddr = 255
	// maxDecodeURL bounds the X-CB-Decode-Engine header.
	maxDecodeURL = 512
	// maxHandoffTokens bounds the prompt length a hand-over names (the
	// model's positions are checked by the engine).
	maxHandoffTokens = 1 << 20
)

// ErrBadHandoff reports a hand-over header that does not parse or is out
// of bounds.
var ErrBadHandoff = errors.New("api: bad hand-over")

// Handoff is what a prefill engine tells the decode engine about a request
// it prefilled: where the prompt's KV is kept and under which secret, and
// what was sampled. On the wire (HeaderHandoff) it is
//
//	v=1;id=<request id>;worker=<host:port>;secret=<base64url, 32 bytes>;first=<token>;n=<prompt tokens>;digest=<hex sha256>;draws=<n>
//
// with the fields in any order, each exactly once.
type Handoff struct {
	// ID is the request id, kept by the decode engine (one request id,
	// one trace): 1–128 characters of [A-Za-z0-9_.-].
	ID string
	// Worker is the prefill engine's worker, host:port, whose
	// KVTransferService keeps the prompt's KV.
	Worker string
	// Secret is the hand-over's secret (HandoffSecretBytes).
	Secret []byte
	// FirstToken is the token the prefill engine sampled.
	FirstToken int32
	// N is the prompt's length in tokens.
	N int
	// Digest is PromptDigest of the prompt's tokens: the decode engine
	// tokenizes the request itself and refuses a different prompt.
	Digest string
	// Draws is the samples drawn on the prefill worker (0 or 1).
	Draws uint32
}

// PromptDigest is the hex SHA-256 of tokens (little-endian int32 each).
func PromptDigest(tokens []int32) string {
	h := sha256.New()
	var b [4]byte
	for _, t := range tokens {
		binary.LittleEndian.PutUint32(b[:], uint32(t))
		h.Write(b[:])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// String encodes h for HeaderHandoff.
func (h Handoff) String() string {
	return fmt.Sprintf("v=1;id=%s;worker=%s;secret=%s;first=%d;n=%d;digest=%s;draws=%d",
		h.ID, h.Worker, base64.RawURLEncoding.EncodeToString(h.Secret), h.FirstToken, h.N, h.Digest, h.Draws)
}

// ParseHandoff parses and bounds a HeaderHandoff value. Every field is
// required, once; anything else is an error wrapping ErrBadHandoff.
func ParseHandoff(s string) (Handoff, error) {
	var h Handoff
	bad := func(format string, args ...any) (Handoff, error) {
		return Handoff{}, fmt.Errorf("%w: %s", ErrBadHandoff, fmt.Sprintf(format, args...))
	}
	if len(s) > MaxHandoffHeader {
		return bad("header of %d bytes, at most %d", len(s), MaxHandoffHeader)
	}
	seen := map[string]bool{}
	for _, part := range strings.Split(s, ";") {
		k, v, ok := strings.Cut(part, "=")
		if !ok {
			return bad("field %q is not key=value", clip(part))
		}
		if seen[k] {
			return bad("field %s twice", clip(k))
		}
		seen[k] = true
		var err error
		switch k {
		case "v":
			if v != "1" {
				return bad("version %q, want 1", clip(v))
			}
		case "id":
			if !validID(v) {
				return bad("request id %q", clip(v))
			}
			h.ID = v
		case "worker":
			if err := ValidHostPort(v); err != nil {
				return bad("worker: %v", err)
			}
			h.Worker = v
		case "secret":
			h.Secret, err = base64.RawURLEncoding.DecodeString(v)
			if err != nil || len(h.Secret) != HandoffSecretBytes {
				return bad("secret is not %d bytes of base64url", HandoffSecretBytes)
			}
		case "first":
			t, err := strconv.ParseInt(v, 10, 32)
			if err != nil || t < 0 {
				return bad("first token %q", clip(v))
			}
			h.FirstToken = int32(t)
		case "n":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > maxHandoffTokens {
				return bad("prompt length %q", clip(v))
			}
			h.N = n
		case "digest":
			if len(v) != 64 || strings.ToLower(v) != v {
				return bad("digest is not 64 lowercase hex digits")
			}
			if _, err := hex.DecodeString(v); err != nil {
				return bad("digest is not 64 lowercase hex digits")
			}
			h.Digest = v
		case "draws":
			d, err := strconv.ParseUint(v, 10, 8)
			if err != nil || d > 1 {
				return bad("draws %q, want 0 or 1", clip(v))
			}
			h.Draws = uint32(d)
		default:
			return bad("unknown field %q", clip(k))
		}
	}
	for _, k := range []string{"v", "id", "worker", "secret", "first", "n", "digest", "draws"} {
		if !seen[k] {
			return bad("field %s missing", k)
		}
	}
	return h, nil
}

// clip shortens a value quoted in an error.
func clip(s string) string {
	if len(s) > 32 {
		return s[:32] + "…"
	}
	return s
}

func validID(s string) bool {
	if s == "" || len(s) > maxHandoffID {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// ValidHostPort checks a gRPC address: host:port, at most 255 bytes, a
// non-empty host of printable ASCII without spaces, a port 1–65535.
func ValidHostPort(s string) error {
	if s == "" || len(s) > maxWorkerAddr {
		return fmt.Errorf("address of %d bytes", len(s))
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil || host == "" {
		return fmt.Errorf("%q is not host:port", clip(s))
	}
	for i := 0; i < len(host); i++ {
		if c := host[i]; c <= ' ' || c >= 0x7f || c == '/' || c == '@' {
			return fmt.Errorf("host %q", clip(host))
		}
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("port %q", clip(port))
	}
	return nil
}

// ParseDecodeEngine parses a HeaderDecodeEngine value: an http or https
// base URL with a host, no user information, query or fragment, and no
// path beyond "/". It returns the URL without a trailing slash.
func ParseDecodeEngine(s string) (string, error) {
	if s == "" || len(s) > maxDecodeURL {
		return "", fmt.Errorf("%w: decode engine URL of %d bytes", ErrBadHandoff, len(s))
	}
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return "", fmt.Errorf("%w: decode engine URL: %v", ErrBadHandoff, err)
	case u.Scheme != "http" && u.Scheme != "https":
		return "", fmt.Errorf("%w: decode engine URL scheme %q, want http or https", ErrBadHandoff, clip(u.Scheme))
	case u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" || (u.Path != "" && u.Path != "/"):
		return "", fmt.Errorf("%w: decode engine URL %q is not scheme://host:port", ErrBadHandoff, clip(s))
	}
	port := u.Port()
	if port == "" {
		port = "1" // the scheme's default port
	}
	if err := ValidHostPort(net.JoinHostPort(u.Hostname(), port)); err != nil {
		return "", fmt.Errorf("%w: decode engine URL: %v", ErrBadHandoff, err)
	}
	return u.Scheme + "://" + u.Host, nil
}

// KVReport is the decode engine's report of a hand-over's transfer, on its
// answer (HeaderKVBytes, HeaderKVBlocksSent, HeaderKVBlocksDeduped).
type KVReport struct {
	Bytes                     int64
	BlocksSent, BlocksDeduped int
}

// Set writes r into h.
func (r KVReport) Set(h http.Header) {
	h.Set(HeaderKVBytes, strconv.FormatInt(r.Bytes, 10))
	h.Set(HeaderKVBlocksSent, strconv.Itoa(r.BlocksSent))
	h.Set(HeaderKVBlocksDeduped, strconv.Itoa(r.BlocksDeduped))
}

// ParseKVReport reads a decode engine's report from its answer's headers;
// ok is false when any is missing, negative or malformed (block counts at
// most 1<<30, bytes at most 1<<50).
func ParseKVReport(h http.Header) (r KVReport, ok bool) {
	num := func(k string, limit int64) (int64, bool) {
		v := h.Get(k)
		if v == "" || len(v) > 20 {
			return 0, false
		}
		n, err := strconv.ParseInt(v, 10, 64)
		return n, err == nil && n >= 0 && n <= limit
	}
	b, ok1 := num(HeaderKVBytes, 1<<50)
	s, ok2 := num(HeaderKVBlocksSent, 1<<30)
	d, ok3 := num(HeaderKVBlocksDeduped, 1<<30)
	if !ok1 || !ok2 || !ok3 {
		return KVReport{}, false
	}
	return KVReport{Bytes: b, BlocksSent: int(s), BlocksDeduped: int(d)}, true
}
