package telemetry

import (
	"encoding/hex"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/trace"
)

// ErrInvalidTraceparent is wrapped by every error [ParseTraceparent] returns.
// A caller that gets it ignores the header and starts a new trace.
var ErrInvalidTraceparent = errors.New("invalid traceparent")

const (
	// traceparentLen is the length of a version 00 traceparent:
	// 2 (version) + 1 + 32 (trace id) + 1 + 16 (parent id) + 1 + 2 (flags).
	traceparentLen = 55

	// knownFlags are the trace flags defined by W3C Trace Context level 2:
	// sampled (0x01) and random (0x02). Other bits are ignored on receipt and
	// never written.
	knownFlags = trace.FlagsSampled | trace.FlagsRandom
)

// unhex maps a lowercase hexadecimal digit to its value and every other byte
// (upper-case A-F included) to 0xff.
var unhex = func() (t [256]byte) {
	for i := range t {
		t[i] = 0xff
	}
	for c := byte('0'); c <= '9'; c++ {
		t[c] = c - '0'
	}
	for c := byte('a'); c <= 'f'; c++ {
		t[c] = c - 'a' + 10
	}
	return t
}()

const hexDigits = "0123456789abcdef"

// decodeHex decodes the lowercase hex string src (len(src) == 2*len(dst))
// into dst. It reports false on any byte that is not a lowercase hex digit.
func decodeHex(dst []byte, src string) bool {
	var bad byte
	for i := range dst {
		hi, lo := unhex[src[2*i]], unhex[src[2*i+1]]
		dst[i] = hi<<4 | lo
		bad |= hi | lo
	}
	return bad&0xf0 == 0
}

func invalid(reason string) error {
	return fmt.Errorf("%w: %s", ErrInvalidTraceparent, reason)
}

// ParseTraceparent parses a W3C traceparent value strictly and returns the
// remote span context it names (Remote is true).
//
// Rules (W3C Trace Context, "traceparent Header Field Values" and
// "Versioning of traceparent"):
//   - fields are version-traceid-parentid-flags, of exactly 2, 32, 16 and
//     2 lowercase hexadecimal digits separated by '-';
//   - version ff is invalid;
//   - version 00 has exactly these four fields (length 55);
//   - a higher version (01..fe) is parsed by its first four fields: the value
//     is at least 55 characters long, and a longer value has '-' at
//     position 55 (what follows is ignored);
//   - an all-zero trace id or parent id is invalid;
//   - of the flags only sampled (01) and random (02) are kept; other bits are
//     ignored, as the specification asks receivers to mask the bit field.
//
// Whitespace, upper-case hex and every other deviation make the value
// invalid: the error wraps [ErrInvalidTraceparent] and the span context is
// the zero value. It is safe for concurrent use.
func ParseTraceparent(s string) (trace.SpanContext, error) {
	if len(s) < traceparentLen {
		return trace.SpanContext{}, invalid("shorter than 55 characters")
	}
	var ver [1]byte
	if !decodeHex(ver[:], s[0:2]) {
		return trace.SpanContext{}, invalid("version is not 2 lowercase hex digits")
	}
	switch {
	case ver[0] == 0xff:
		return trace.SpanContext{}, invalid("version ff is forbidden")
	case ver[0] == 0 && len(s) != traceparentLen:
		return trace.SpanContext{}, invalid("version 00 must be exactly 55 characters (four fields)")
	case ver[0] != 0 && len(s) > traceparentLen && s[traceparentLen] != '-':
		return trace.SpanContext{}, invalid("flags must be followed by '-' or the end of the value")
	}
	if s[2] != '-' || s[35] != '-' || s[52] != '-' {
		return trace.SpanContext{}, invalid("fields must be 2-32-16-2 characters separated by '-'")
	}
	var cfg trace.SpanContextConfig
	if !decodeHex(cfg.TraceID[:], s[3:35]) {
		return trace.SpanContext{}, invalid("trace id is not 32 lowercase hex digits")
	}
	if !decodeHex(cfg.SpanID[:], s[36:52]) {
		return trace.SpanContext{}, invalid("parent id is not 16 lowercase hex digits")
	}
	var flags [1]byte
	if !decodeHex(flags[:], s[53:55]) {
		return trace.SpanContext{}, invalid("flags are not 2 lowercase hex digits")
	}
	if !cfg.TraceID.IsValid() {
		return trace.SpanContext{}, invalid("trace id is all zeros")
	}
	if !cfg.SpanID.IsValid() {
		return trace.SpanContext{}, invalid("parent id is all zeros")
	}
	cfg.TraceFlags = trace.TraceFlags(flags[0]) & knownFlags
	cfg.Remote = true
	return trace.NewSpanContext(cfg), nil
}

// FormatTraceparent writes sc as a version 00 traceparent value
// ("00-<32 hex>-<16 hex>-<2 hex>", lowercase, flags always two digits and
// limited to sampled and random). It returns "" when sc is not valid (zero
// trace id or span id). It is safe for concurrent use.
func FormatTraceparent(sc trace.SpanContext) string {
	if !sc.IsValid() {
		return ""
	}
	var b [traceparentLen]byte
	b[0], b[1], b[2] = '0', '0', '-'
	tid, sid := sc.TraceID(), sc.SpanID()
	hex.Encode(b[3:35], tid[:])
	b[35] = '-'
	hex.Encode(b[36:52], sid[:])
	b[52] = '-'
	f := byte(sc.TraceFlags() & knownFlags)
	b[53], b[54] = hexDigits[f>>4], hexDigits[f&0x0f]
	return string(b[:])
}
