package fleet

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
	"math"
	"net/url"
	"os"
	"strings"

	"github.com/cacheblend/cacheblend/blend/chunkstore"
)

// Values in Redis are untrusted: whoever can write to Redis (its password
// leaked, another tenant, a compromised node of another fleet) could plant
// any bytes under any key. Every value a Tier writes is therefore sealed
// with an HMAC-SHA256 under the fleet key (Config.Key), which Redis never
// sees, and every value it reads is bounded in size before it is read and
// opened (tag checked) before it is decoded:
//
//	value  = body | "CBF2" | tag
//	tag    = HMAC-SHA256(fleet key, "cb-fleet-value\x00" | kind | u32 len(key) | key
//	                                | u32 len(layout) | layout | body | "CBF2")
//
// kind is 'c' (a chunk: body is the L2 chunk encoding), 's' (a directory
// sequence: body is the EncodeSequence form) or 'f' (a fingerprint entry:
// body is "<sequence id>:<chunk>:<sequence value size>"); key is the Redis
// key the value is stored under (its namespace names the model, the world
// size and the KV layout); layout is, for a chunk, the dtype and shape it
// must have: "f32", layers, KV heads, head dim (u32 each), the RoPE base
// (float64 bits) and the rank (u32). A value moved to another key, a value
// of another layout, a value sealed with another fleet's key and a value of
// an older format (version 1 had no tag) all fail the check: a counted miss,
// never served, never kept in L1/L2, never written back.
const (
	// MinKeyLen is the shortest fleet key New accepts, in bytes.
	MinKeyLen = 32
	// MaxKeyFileBytes bounds a key, URL or password file read by
	// ReadSecretFile.
	MaxKeyFileBytes = 4096

	valueMagic   = "CBF2"
	tagLen       = sha256.Size
	sealOverhead = len(valueMagic) + tagLen
	macDomain    = "cb-fleet-value\x00"

	kindChunk    = 'c'
	kindSequence = 's'
	kindFP       = 'f'

	// maxFPValue bounds a fingerprint entry read from Redis (a 32-character
	// id, a chunk index and a size, plus the seal).
	maxFPValue = 128 + sealOverhead
	// maxModelLen is the longest model name a chunk may carry (the chunk
	// file format's u16 length, bounded by chunkstore.MaxModelLen).
	maxModelLen = chunkstore.MaxModelLen
)

// Why a value read from Redis was refused (see Stats).
var (
	// errUnauthenticated: no valid tag under this fleet's key (another
	// fleet's key, a tampered value, a value moved from another key, a value
	// of the unauthenticated version 1 format).
	errUnauthenticated = errors.New("fleet: value not authenticated by the fleet key")
	// errOversize: larger than the most its layout allows.
	errOversize = errors.New("fleet: value larger than its layout allows")
	// errNonFinite: a chunk whose K/V holds a NaN or an infinity.
	errNonFinite = errors.New("fleet: chunk K/V not finite")
	// errCorrupt (fleet.go): authenticated, but does not decode or is not
	// what its key names (malformed).
)

// sealer computes the tags of one Tier's values. Safe for concurrent use
// (each call makes its own HMAC state).
type sealer struct{ key []byte }

func (s sealer) mac(kind byte, key string, layout, body []byte) hash.Hash {
	m := hmac.New(sha256.New, s.key)
	var n [4]byte
	io.WriteString(m, macDomain)
	m.Write([]byte{kind})
	binary.LittleEndian.PutUint32(n[:], uint32(len(key)))
	m.Write(n[:])
	io.WriteString(m, key)
	binary.LittleEndian.PutUint32(n[:], uint32(len(layout)))
	m.Write(n[:])
	m.Write(layout)
	m.Write(body)
	io.WriteString(m, valueMagic)
	return m
}

// seal appends the magic and the tag to body (reusing its capacity when it
// can) and returns the value to store under key.
func (s sealer) seal(kind byte, key string, layout, body []byte) []byte {
	tag := s.mac(kind, key, layout, body).Sum(nil)
	out := append(body, valueMagic...)
	return append(out, tag...)
}

// open checks the seal of v, read from key, and returns its body (aliasing
// v); errUnauthenticated when the magic or the tag is wrong.
func (s sealer) open(kind byte, key string, layout, v []byte) ([]byte, error) {
	if len(v) < sealOverhead {
		return nil, errUnauthenticated
	}
	body, trailer := v[:len(v)-sealOverhead], v[len(v)-sealOverhead:]
	if string(trailer[:len(valueMagic)]) != valueMagic {
		return nil, errUnauthenticated
	}
	if !hmac.Equal(s.mac(kind, key, layout, body).Sum(nil), trailer[len(valueMagic):]) {
		return nil, errUnauthenticated
	}
	return body, nil
}

// chunkLayout is the layout a chunk value's tag binds: dtype, shape, RoPE
// base and rank.
func chunkLayout(l chunkstore.Layout, rank int) []byte {
	b := make([]byte, 0, 3+4*3+8+4)
	b = append(b, "f32"...)
	b = binary.LittleEndian.AppendUint32(b, uint32(l.NumLayers))
	b = binary.LittleEndian.AppendUint32(b, uint32(l.KVHeads))
	b = binary.LittleEndian.AppendUint32(b, uint32(l.HeadDim))
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(l.RoPETheta))
	return binary.LittleEndian.AppendUint32(b, uint32(rank))
}

// MaxChunkValue is the largest value a chunk of layout l with at most
// maxTokens tokens can be in Redis: the chunk file encoding (format
// chunkstore.FileVersion) with the longest model name, plus the seal. A
// value read from Redis beyond it is refused without being read whole.
func MaxChunkValue(l chunkstore.Layout, maxTokens int) int64 {
	align := func(n int64) int64 { return (n + 63) &^ 63 }
	n := int64(maxTokens)
	hdr := align(84 + maxModelLen)
	kvOff := align(hdr + 8*n)
	kvFloats := 2 * int64(l.NumLayers) * n * int64(l.KVHeads) * int64(l.HeadDim)
	return kvOff + 4*kvFloats + 4 + int64(sealOverhead)
}

// finite reports whether every value of kv is finite (no NaN, no ±Inf).
func finite(kv []float32) bool {
	for _, x := range kv {
		if math.Float32bits(x)&0x7f800000 == 0x7f800000 {
			return false
		}
	}
	return true
}

// ReadSecretFile reads a secret (a fleet key, a Redis URL or password) from
// path: at most MaxKeyFileBytes, surrounding white space trimmed. A file
// that others (not the owner or its group) may read, or that is not a
// regular file, is refused: its secret is not one.
func ReadSecretFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("fleet: secret file: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("fleet: secret file: %w", err)
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("fleet: secret file %s: not a regular file", path)
	}
	if st.Mode().Perm()&0o007 != 0 {
		return "", fmt.Errorf("fleet: secret file %s: mode %v lets every user read it (chmod o-rwx)", path, st.Mode().Perm())
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxKeyFileBytes+1))
	if err != nil {
		return "", fmt.Errorf("fleet: secret file %s: %w", path, err)
	}
	if len(b) > MaxKeyFileBytes {
		return "", fmt.Errorf("fleet: secret file %s: longer than %d bytes", path, MaxKeyFileBytes)
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "", fmt.Errorf("fleet: secret file %s: empty", path)
	}
	return s, nil
}

// CheckKey reports whether key can be a fleet key (at least MinKeyLen
// bytes; `openssl rand -hex 32` makes one).
func CheckKey(key []byte) error {
	if len(key) < MinKeyLen {
		return fmt.Errorf("fleet: fleet key of %d bytes, want at least %d (e.g. openssl rand -hex 32)", len(key), MinKeyLen)
	}
	return nil
}

// URLHasPassword reports whether a Redis URL carries a password (in its
// user information; for a cluster URL, of its first node).
func URLHasPassword(raw string) bool {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return false
	}
	_, ok := u.User.Password()
	return ok
}

// WithPassword returns the Redis URL raw with its password set to password
// (keeping its user name); raw must not carry one already.
func WithPassword(raw, password string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "redis" && u.Scheme != "rediss") || u.Host == "" {
		return "", fmt.Errorf("fleet: Redis URL %q: want redis://[user@]host:port or rediss://…", redactURL(raw))
	}
	if URLHasPassword(raw) {
		return "", fmt.Errorf("fleet: Redis URL %q already carries a password", redactURL(raw))
	}
	user := ""
	if u.User != nil {
		user = u.User.Username()
	}
	u.User = url.UserPassword(user, password)
	return u.String(), nil
}
