package api

import (
	"bytes"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"
)

func sampleHandoff() Handoff {
	return Handoff{ID: "chatcmpl-0123abcd", Worker: "127.0.0.1:50061", Secret: bytes.Repeat([]byte{0xab}, HandoffSecretBytes),
		FirstToken: 101, N: 1884, Digest: PromptDigest([]int32{256, 1, 2}), Draws: 1, Expires: 1 << 33}.Sign([]byte("sample stack key, 32 bytes long."), "http://127.0.0.1:8001")
}

// TestHandoffSignature: a signed hand-over verifies with its key, for its
// decode engine, before its expiry; any other field, key, target or time
// fails with the typed error.
func TestHandoffSignature(t *testing.T) {
	key, target := []byte("sample stack key, 32 bytes long."), "http://127.0.0.1:8001"
	h := sampleHandoff()
	now := time.Unix(1<<33-10, 0)
	if err := h.Verify(key, target, now); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		mut  func(*Handoff) ([]byte, string, time.Time)
		want error
	}{
		{"other digest", func(h *Handoff) ([]byte, string, time.Time) {
			h.Digest = PromptDigest([]int32{9})
			return key, target, now
		}, ErrBadSignature},
		{"other length", func(h *Handoff) ([]byte, string, time.Time) { h.N++; return key, target, now }, ErrBadSignature},
		{"other secret", func(h *Handoff) ([]byte, string, time.Time) {
			h.Secret = bytes.Repeat([]byte{1}, 32)
			return key, target, now
		}, ErrBadSignature},
		{"other first token", func(h *Handoff) ([]byte, string, time.Time) { h.FirstToken++; return key, target, now }, ErrBadSignature},
		{"later expiry", func(h *Handoff) ([]byte, string, time.Time) { h.Expires++; return key, target, now }, ErrBadSignature},
		{"other decode engine", func(h *Handoff) ([]byte, string, time.Time) { return key, "http://127.0.0.1:8002", now }, ErrBadSignature},
		{"other key", func(h *Handoff) ([]byte, string, time.Time) {
			return []byte("another key of 32 bytes, really."), target, now
		}, ErrBadSignature},
		{"no key", func(h *Handoff) ([]byte, string, time.Time) { return nil, target, now }, ErrNoStackKey},
		{"expired", func(h *Handoff) ([]byte, string, time.Time) { return key, target, time.Unix(1<<33+1, 0) }, ErrExpired},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := sampleHandoff()
			k, tg, at := tc.mut(&h)
			if err := h.Verify(k, tg, at); !errors.Is(err, tc.want) {
				t.Fatalf("%v, want %v", err, tc.want)
			}
		})
	}
	// The signature survives the wire.
	got, err := ParseHandoff(h.String())
	if err != nil || got.Verify(key, target, now) != nil {
		t.Fatalf("parsed %v", err)
	}
}

func TestHandoffRoundTrip(t *testing.T) {
	h := sampleHandoff()
	got, err := ParseHandoff(h.String())
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != h.ID || got.Worker != h.Worker || !bytes.Equal(got.Secret, h.Secret) || got.FirstToken != h.FirstToken ||
		got.N != h.N || got.Digest != h.Digest || got.Draws != h.Draws {
		t.Fatalf("round trip %+v, want %+v", got, h)
	}
	if PromptDigest([]int32{1, 2}) == PromptDigest([]int32{2, 1}) || len(PromptDigest(nil)) != 64 {
		t.Error("digest")
	}
}

func TestParseHandoffRefusals(t *testing.T) {
	good := sampleHandoff().String()
	field := func(k, v string) string {
		parts := strings.Split(good, ";")
		for i, p := range parts {
			if strings.HasPrefix(p, k+"=") {
				parts[i] = k + "=" + v
			}
		}
		return strings.Join(parts, ";")
	}
	for name, s := range map[string]string{
		"empty":             "",
		"version 2":         field("v", "2"),
		"id with space":     field("id", "a b"),
		"id too long":       field("id", strings.Repeat("a", 129)),
		"worker no port":    field("worker", "127.0.0.1"),
		"worker port 0":     field("worker", "127.0.0.1:0"),
		"worker port big":   field("worker", "h:65536"),
		"worker slash":      field("worker", "a/b:1"),
		"short secret":      field("secret", "AAAA"),
		"secret not base64": field("secret", strings.Repeat("*", 43)),
		"negative first":    field("first", "-1"),
		"first overflow":    field("first", "9999999999"),
		"n zero":            field("n", "0"),
		"n huge":            field("n", "99999999"),
		"digest short":      field("digest", "abcd"),
		"digest upper":      field("digest", strings.Repeat("A", 64)),
		"digest not hex":    field("digest", strings.Repeat("g", 64)),
		"draws 2":           field("draws", "2"),
		"missing field":     strings.Replace(good, ";draws=1", "", 1),
		"duplicate field":   good + ";n=3",
		"unknown field":     good + ";x=1",
		"no equals":         good + ";x",
		"too long":          good + ";" + strings.Repeat("x", MaxHandoffHeader),
	} {
		if _, err := ParseHandoff(s); !errors.Is(err, ErrBadHandoff) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestParseDecodeEngine(t *testing.T) {
	for in, want := range map[string]string{
		"http://127.0.0.1:8001":              "http://127.0.0.1:8001",
		"http://127.0.0.1:8001/":             "http://127.0.0.1:8001",
		"https://decode.example":             "https://decode.example",
		"http://[::1]:8001":                  "http://[::1]:8001",
		"ftp://x:1":                          "",
		"http://":                            "",
		"http://u:p@h:1":                     "",
		"http://h:1/v1":                      "",
		"http://h:1?x=1":                     "",
		"http://h:1#f":                       "",
		"http://h:0":                         "",
		"h:1":                                "",
		"":                                   "",
		"http://" + strings.Repeat("a", 600): "",
	} {
		got, err := ParseDecodeEngine(in)
		if want == "" {
			if !errors.Is(err, ErrBadHandoff) {
				t.Errorf("%q: %q, %v: want an error", in, got, err)
			}
			continue
		}
		if err != nil || got != want {
			t.Errorf("%q: %q, %v: want %q", in, got, err, want)
		}
	}
}

func TestKVReport(t *testing.T) {
	h := http.Header{}
	KVReport{Bytes: 6 << 20, BlocksSent: 100, BlocksDeduped: 18}.Set(h)
	if r, ok := ParseKVReport(h); !ok || r.Bytes != 6<<20 || r.BlocksSent != 100 || r.BlocksDeduped != 18 {
		t.Fatalf("%+v %v", r, ok)
	}
	h.Set(HeaderKVBlocksSent, "-1")
	if _, ok := ParseKVReport(h); ok {
		t.Error("negative accepted")
	}
	if _, ok := ParseKVReport(http.Header{}); ok {
		t.Error("missing accepted")
	}
}

// FuzzParseHandoff: the hand-over header never panics, and what it accepts
// is within bounds and encodes back to a header that parses the same.
func FuzzParseHandoff(f *testing.F) {
	f.Add(sampleHandoff().String())
	f.Add("v=1;id=a;worker=h:1;secret=;first=0;n=1;digest=;draws=0")
	f.Add(";;;=")
	f.Fuzz(func(t *testing.T, s string) {
		h, err := ParseHandoff(s)
		if err != nil {
			return
		}
		if len(h.Secret) != HandoffSecretBytes || h.N < 1 || h.N > maxHandoffTokens || h.FirstToken < 0 || h.Draws > 1 ||
			!validID(h.ID) || ValidHostPort(h.Worker) != nil || len(h.Digest) != 64 {
			t.Fatalf("accepted out of bounds: %+v", h)
		}
		again, err := ParseHandoff(h.String())
		if err != nil || again.ID != h.ID || again.Worker != h.Worker || !bytes.Equal(again.Secret, h.Secret) ||
			again.FirstToken != h.FirstToken || again.N != h.N || again.Digest != h.Digest || again.Draws != h.Draws {
			t.Fatalf("re-encoded %q: %+v, %v", h.String(), again, err)
		}
	})
}

// FuzzParseDecodeEngine: the decode engine header never panics, and what
// it accepts parses again to itself.
func FuzzParseDecodeEngine(f *testing.F) {
	f.Add("http://127.0.0.1:8001")
	f.Add("https://[::1]:1/")
	f.Fuzz(func(t *testing.T, s string) {
		u, err := ParseDecodeEngine(s)
		if err != nil {
			return
		}
		if again, err := ParseDecodeEngine(u); err != nil || again != u {
			t.Fatalf("%q → %q → %q, %v", s, u, again, err)
		}
	})
}

// FuzzParseKVReport: the decode engine's report headers never panic the
// parser, and what it accepts is within bounds.
func FuzzParseKVReport(f *testing.F) {
	f.Add("6144", "3", "5")
	f.Add("-1", "x", "")
	f.Fuzz(func(t *testing.T, b, s, d string) {
		h := http.Header{}
		h.Set(HeaderKVBytes, b)
		h.Set(HeaderKVBlocksSent, s)
		h.Set(HeaderKVBlocksDeduped, d)
		r, ok := ParseKVReport(h)
		if ok && (r.Bytes < 0 || r.Bytes > 1<<50 || r.BlocksSent < 0 || r.BlocksSent > 1<<30 || r.BlocksDeduped < 0 || r.BlocksDeduped > 1<<30) {
			t.Fatalf("accepted %+v", r)
		}
	})
}
