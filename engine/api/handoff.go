package api

import (
	"crypto/hmac"
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
	"time"
)

// The HTTP contract of a prefill/decode hand-over (docs/design.md §9).
const (
	// HeaderDecodeEngine, on a generation request to a prefill engine
	// (cb engine --role prefill), names the decode engine to hand the
	// request over to: its base URL, http://host:port. Set by the caller
	// (the gateway).
	HeaderDecodeEngine = "X-CB-Decode-Engine"
	// HeaderDecodeAuth, next to HeaderDecodeEngine, is the gateway's proof
	// that it chose the decode engine (DecodeAuth): an HMAC with the stack
	// key over the decode engine's URL, a nonce and an expiry. A prefill
	// engine honours HeaderDecodeEngine only with a valid proof.
	HeaderDecodeAuth = "X-CB-Decode-Auth"
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
	// MinStackKeyBytes is the shortest stack key taken (the key that signs
	// hand-overs and the gateway's decode-engine proofs).
	MinStackKeyBytes = 16
	// HandoffTTL is how long a signed hand-over (Handoff.Expires) and a
	// gateway's proof (DecodeAuth) stay valid after they were made: both are
	// checked on arrival, a moment later; the margin covers clocks of
	// different hosts.
	HandoffTTL = 30 * time.Second
	// maxNonce bounds the nonce of a HeaderDecodeAuth proof.
	maxNonce = 64
)

// ErrBadHandoff reports a hand-over header that does not parse or is out
// of bounds.
var ErrBadHandoff = errors.New("api: bad hand-over")

// Authentication failures of a hand-over (Handoff.Verify) or of a
// gateway's decode-engine proof (VerifyDecodeAuth); the caller answers 403
// and counts the reason.
var (
	// ErrNoStackKey: this engine has no stack key, so it can neither check
	// nor make a signature; hand-overs are refused.
	ErrNoStackKey = errors.New("api: no stack key configured")
	// ErrBadSignature: the signature does not verify with the stack key
	// (forged, altered, made for another prompt or another decode engine).
	ErrBadSignature = errors.New("api: signature does not verify")
	// ErrExpired: the signature verifies but its expiry has passed.
	ErrExpired = errors.New("api: signature expired")
)

// Handoff is what a prefill engine tells the decode engine about a request
// it prefilled: where the prompt's KV is kept and under which secret, and
// what was sampled. On the wire (HeaderHandoff) it is
//
//	v=1;id=<request id>;worker=<host:port>;secret=<base64url, 32 bytes>;first=<token>;n=<prompt tokens>;digest=<hex sha256>;draws=<n>;exp=<unix seconds>;sig=<base64url, 32 bytes>
//
// with the fields in any order, each exactly once. sig is Sign's HMAC with
// the stack key over every other field and the decode engine's URL: a
// decode engine takes over only a hand-over made for it, for the prompt it
// tokenized, before exp (Verify).
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
	// Expires is when the hand-over stops being valid (unix seconds).
	Expires int64
	// Sig is the HMAC-SHA256 of the hand-over (Sign).
	Sig []byte
	// Tokens are the prompt's tokens as the decode engine tokenized them,
	// set by the decode engine once they match N and Digest (not on the
	// wire): its worker checks the pulled blocks against them.
	Tokens []int32
}

// signed is the message Sign authenticates: every field but Sig, and the
// decode engine's URL.
func (h Handoff) signed(target string) []byte {
	return fmt.Appendf(nil, "cb-handoff/1\nid=%s\nworker=%s\nsecret=%s\nfirst=%d\nn=%d\ndigest=%s\ndraws=%d\nexp=%d\ntarget=%s",
		h.ID, h.Worker, base64.RawURLEncoding.EncodeToString(h.Secret), h.FirstToken, h.N, h.Digest, h.Draws, h.Expires, target)
}

// Sign returns h with Sig set: the HMAC-SHA256 with key over every field
// and target, the decode engine's base URL (as ParseDecodeEngine returns it).
func (h Handoff) Sign(key []byte, target string) Handoff {
	m := hmac.New(sha256.New, key)
	m.Write(h.signed(target))
	h.Sig = m.Sum(nil)
	return h
}

// Verify checks h's signature with key for the decode engine target (its
// base URL as the prefill engine addressed it) and its expiry at now:
// ErrNoStackKey without a key, ErrBadSignature, ErrExpired.
func (h Handoff) Verify(key []byte, target string, now time.Time) error {
	if len(key) == 0 {
		return ErrNoStackKey
	}
	m := hmac.New(sha256.New, key)
	m.Write(h.signed(target))
	if !hmac.Equal(m.Sum(nil), h.Sig) {
		return ErrBadSignature
	}
	if now.Unix() > h.Expires {
		return fmt.Errorf("%w: at %s", ErrExpired, time.Unix(h.Expires, 0).UTC().Format(time.RFC3339))
	}
	return nil
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
	return fmt.Sprintf("v=1;id=%s;worker=%s;secret=%s;first=%d;n=%d;digest=%s;draws=%d;exp=%d;sig=%s",
		h.ID, h.Worker, base64.RawURLEncoding.EncodeToString(h.Secret), h.FirstToken, h.N, h.Digest, h.Draws,
		h.Expires, base64.RawURLEncoding.EncodeToString(h.Sig))
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
		case "exp":
			e, err := strconv.ParseInt(v, 10, 64)
			if err != nil || e < 0 || len(v) > 12 {
				return bad("expiry %q", clip(v))
			}
			h.Expires = e
		case "sig":
			h.Sig, err = base64.RawURLEncoding.DecodeString(v)
			if err != nil || len(h.Sig) != sha256.Size {
				return bad("sig is not %d bytes of base64url", sha256.Size)
			}
		default:
			return bad("unknown field %q", clip(k))
		}
	}
	for _, k := range []string{"v", "id", "worker", "secret", "first", "n", "digest", "draws", "exp", "sig"} {
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

// DecodeAuth returns a HeaderDecodeAuth value: the gateway's proof, made
// with the stack key, that it chose the decode engine decodeURL (its base
// URL as ParseDecodeEngine returns it) for one request (nonce: 1–64
// characters of [A-Za-z0-9_.-], e.g. a random id), valid until exp.
func DecodeAuth(key []byte, decodeURL, nonce string, exp time.Time) string {
	return fmt.Sprintf("v=1;exp=%d;nonce=%s;sig=%s", exp.Unix(), nonce,
		base64.RawURLEncoding.EncodeToString(decodeAuthMAC(key, decodeURL, nonce, exp.Unix())))
}

func decodeAuthMAC(key []byte, decodeURL, nonce string, exp int64) []byte {
	m := hmac.New(sha256.New, key)
	fmt.Fprintf(m, "cb-decode-engine/1\nurl=%s\nnonce=%s\nexp=%d", decodeURL, nonce, exp)
	return m.Sum(nil)
}

// VerifyDecodeAuth checks a HeaderDecodeAuth value for the decode engine
// decodeURL with key at now: ErrNoStackKey without a key, ErrBadHandoff
// when it does not parse (bounded: at most MaxHandoffHeader bytes),
// ErrBadSignature, ErrExpired.
func VerifyDecodeAuth(key []byte, header, decodeURL string, now time.Time) error {
	if len(key) == 0 {
		return ErrNoStackKey
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrBadHandoff, HeaderDecodeAuth, fmt.Sprintf(format, args...))
	}
	if header == "" {
		return fmt.Errorf("%w: %s missing", ErrBadSignature, HeaderDecodeAuth)
	}
	if len(header) > MaxHandoffHeader {
		return bad("%d bytes, at most %d", len(header), MaxHandoffHeader)
	}
	var (
		exp   int64
		nonce string
		sig   []byte
	)
	seen := map[string]bool{}
	for _, part := range strings.Split(header, ";") {
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
		case "exp":
			exp, err = strconv.ParseInt(v, 10, 64)
			if err != nil || exp < 0 || len(v) > 12 {
				return bad("expiry %q", clip(v))
			}
		case "nonce":
			if len(v) > maxNonce || !validID(v) {
				return bad("nonce %q", clip(v))
			}
			nonce = v
		case "sig":
			sig, err = base64.RawURLEncoding.DecodeString(v)
			if err != nil || len(sig) != sha256.Size {
				return bad("sig is not %d bytes of base64url", sha256.Size)
			}
		default:
			return bad("unknown field %q", clip(k))
		}
	}
	for _, k := range []string{"v", "exp", "nonce", "sig"} {
		if !seen[k] {
			return bad("field %s missing", k)
		}
	}
	if !hmac.Equal(decodeAuthMAC(key, decodeURL, nonce, exp), sig) {
		return ErrBadSignature
	}
	if now.Unix() > exp {
		return fmt.Errorf("%w: at %s", ErrExpired, time.Unix(exp, 0).UTC().Format(time.RFC3339))
	}
	return nil
}
