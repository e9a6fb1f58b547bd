package engine

import (
	"strings"
	"testing"

	"github.com/cacheblend/cacheblend/tokenizer"
)

func pushAll(ts *textStream, s string) (stopped bool, streamed string) {
	var sb strings.Builder
	for _, t := range (tokenizer.Tokenizer{}).Encode(s) {
		if ts.push(t) {
			stopped = true
			break
		}
		sb.WriteString(ts.take())
	}
	sb.WriteString(ts.finish())
	return stopped, sb.String()
}

func TestTextStream(t *testing.T) {
	for _, tc := range []struct {
		name     string
		in       string
		stops    []string
		want     string
		wantStop bool
	}{
		{"plain", "hello world", nil, "hello world", false},
		{"multibyte kept whole", "héllo 中文 🙂", nil, "héllo 中文 🙂", false},
		{"stop", "hello world, bye", []string{"world"}, "hello ", true},
		{"earliest stop wins", "abcdef", []string{"de", "bc"}, "a", true},
		{"stop across tokens", "one\n\ntwo", []string{"\n\n"}, "one", true},
		{"prefix of stop at end flushed", "hello wor", []string{"world"}, "hello wor", false},
		{"multibyte stop", "a中b", []string{"中"}, "a", true},
		{"invalid bytes", "a\xffb\xe4", nil, "a\ufffdb\ufffd", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := newTextStream(tokenizer.Tokenizer{}, tc.stops)
			stopped, streamed := pushAll(ts, tc.in)
			if stopped != tc.wantStop || streamed != tc.want || ts.all() != tc.want {
				t.Fatalf("stopped %v streamed %q all %q, want %v %q", stopped, streamed, ts.all(), tc.wantStop, tc.want)
			}
		})
	}
}

// TestTextStreamHoldsBack checks that nothing that could still become a stop
// sequence or the head of a character is handed out early.
func TestTextStreamHoldsBack(t *testing.T) {
	ts := newTextStream(tokenizer.Tokenizer{}, []string{"STOP"})
	for _, b := range []byte("abST") {
		ts.push(int32(b))
	}
	if got := ts.take(); got != "ab" {
		t.Fatalf("take = %q, want %q (ST held back)", got, "ab")
	}
	ts2 := newTextStream(tokenizer.Tokenizer{}, nil)
	for _, b := range []byte("x\xe4\xb8") { // an incomplete 中
		ts2.push(int32(b))
	}
	if got := ts2.take(); got != "x" {
		t.Fatalf("take = %q, want %q", got, "x")
	}
	ts2.push(0xad)
	if got := ts2.take(); got != "中" {
		t.Fatalf("take = %q, want 中", got)
	}
}

func BenchmarkTextStreamPush(b *testing.B) {
	toks := (tokenizer.Tokenizer{}).Encode(strings.Repeat("héllo wörld, ", 40))
	b.ReportAllocs()
	for b.Loop() {
		ts := newTextStream(tokenizer.Tokenizer{}, []string{"STOP"})
		for _, t := range toks {
			ts.push(t)
			_ = ts.take()
		}
		_ = ts.finish()
	}
}
