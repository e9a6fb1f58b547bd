package apiclient

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestReadStream(t *testing.T) {
	const c1 = `data: {"id":"r1","choices":[{"delta":{"role":"assistant","content":""}}]}` + "\n\n"
	const c2 = `data: {"id":"r1","choices":[{"delta":{"content":"hi"}}]}` + "\n\n"
	const usage = `data: {"id":"r1","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":5}}` + "\n\n"
	const done = "data: [DONE]\n\n"
	for _, tc := range []struct {
		name     string
		in       string
		kind     string // "" = success
		content  bool
		chunks   int
		usage    bool
		prompt   int
		complete int
	}{
		{"full stream", c1 + c2 + c2 + usage + done, "", true, 2, true, 12, 5},
		{"no space after data and comments", ": ping\nevent: message\ndata:" + c2[5:] + done, "", true, 1, false, 0, 0},
		{"role chunk only", c1 + done, "", false, 0, false, 0, 0},
		{"error event", c2 + `data: {"error":{"message":"boom","type":"internal"}}` + "\n\n" + done, KindStream, true, 1, false, 0, 0},
		{"bad JSON", c2 + "data: {nope\n\n", KindBadStream, true, 1, false, 0, 0},
		{"negative usage", `data: {"usage":{"prompt_tokens":-1,"completion_tokens":2}}` + "\n\n", KindBadStream, false, 0, false, 0, 0},
		{"negative cacheblend usage", `data: {"usage":{"prompt_tokens":1,"completion_tokens":2,"cacheblend":{"non_prefix_hit_tokens":-3}}}` + "\n\n", KindBadStream, false, 0, false, 0, 0},
		{"no DONE", c1 + c2, KindTruncated, true, 1, false, 0, 0},
		{"empty body", "", KindTruncated, false, 0, false, 0, 0},
		{"oversized line", "data: " + strings.Repeat("x", maxLine+10) + "\n", KindBadStream, false, 0, false, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			res, err := ReadStream(strings.NewReader(tc.in), func() { calls++ })
			var se *Error
			switch {
			case tc.kind == "" && err != nil:
				t.Fatalf("error %v", err)
			case tc.kind != "" && (!errors.As(err, &se) || se.Kind != tc.kind || se.Status != 0):
				t.Fatalf("error %v, want kind %s", err, tc.kind)
			}
			if (calls == 1) != tc.content || calls > 1 {
				t.Errorf("onContent called %d times", calls)
			}
			if res.ContentChunks != tc.chunks || res.Usage != tc.usage || res.PromptTokens != tc.prompt || res.CompletionTokens != tc.complete {
				t.Errorf("result %+v", res)
			}
			if len(res.Deltas) != tc.chunks || strings.Join(res.Deltas, "") != strings.Repeat("hi", tc.chunks) {
				t.Errorf("deltas %q", res.Deltas)
			}
			if tc.chunks > 0 && res.ID != "r1" {
				t.Errorf("id %q", res.ID)
			}
		})
	}
}

// The usage's cacheblend extension is read, quality_sampled included.
func TestReadStreamCacheBlendUsage(t *testing.T) {
	for _, tc := range []struct {
		name  string
		usage string
		want  *UsageCacheBlend
	}{
		{"none", `{"prompt_tokens":9,"completion_tokens":1}`, nil},
		{"reuse", `{"prompt_tokens":9,"completion_tokens":1,"cacheblend":{"prefix_hit_tokens":2,"non_prefix_hit_tokens":5,"recomputed_tokens":2}}`,
			&UsageCacheBlend{PrefixHitTokens: 2, NonPrefixHitTokens: 5, RecomputedTokens: 2}},
		{"sampled", `{"prompt_tokens":9,"completion_tokens":1,"cacheblend":{"non_prefix_hit_tokens":9,"quality_sampled":true}}`,
			&UsageCacheBlend{NonPrefixHitTokens: 9, QualitySampled: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := ReadStream(strings.NewReader("data: {\"usage\":"+tc.usage+"}\n\ndata: [DONE]\n"), nil)
			if err != nil {
				t.Fatal(err)
			}
			if (res.CacheBlend == nil) != (tc.want == nil) || (tc.want != nil && *res.CacheBlend != *tc.want) {
				t.Fatalf("cacheblend %+v, want %+v", res.CacheBlend, tc.want)
			}
		})
	}
}

// The content deltas in order (empty ones skipped) and the last usage chunk's extension.
func TestReadStreamDeltasAndLastUsage(t *testing.T) {
	for _, tc := range []struct {
		name   string
		in     string
		deltas string // joined by "|"
		want   *UsageCacheBlend
	}{
		{name: "deltas and a sampled check", deltas: "a|b", want: &UsageCacheBlend{NonPrefixHitTokens: 7, QualitySampled: true},
			in: "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"\"}}]}\n\n" +
				"data:{\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"cacheblend\":{\"quality_sampled\":true,\"non_prefix_hit_tokens\":7}}}\n\ndata: [DONE]\n\n"},
		{name: "last usage wins, no space after data:", want: &UsageCacheBlend{NonPrefixHitTokens: 5},
			in: "data: {\"usage\":{\"cacheblend\":{\"non_prefix_hit_tokens\":1}}}\ndata:{\"usage\":{\"cacheblend\":{\"non_prefix_hit_tokens\":5}}}\ndata: [DONE]\n"},
		{name: "a later usage without the extension", in: "data: {\"usage\":{\"cacheblend\":{\"non_prefix_hit_tokens\":1}}}\ndata: {\"usage\":{\"prompt_tokens\":3}}\ndata: [DONE]\n"},
		{name: "null extension", in: "data: {\"usage\":{\"cacheblend\":null}}\ndata: [DONE]\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := ReadStream(strings.NewReader(tc.in), nil)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Join(res.Deltas, "|") != tc.deltas || res.ContentChunks != len(res.Deltas) {
				t.Errorf("deltas %q, %d content chunks; want %q", res.Deltas, res.ContentChunks, tc.deltas)
			}
			if (res.CacheBlend == nil) != (tc.want == nil) || (tc.want != nil && *res.CacheBlend != *tc.want) {
				t.Errorf("cacheblend %+v, want %+v", res.CacheBlend, tc.want)
			}
		})
	}
}

func TestReadStreamNilCallbackAndReadError(t *testing.T) {
	res, err := ReadStream(strings.NewReader(`data: {"choices":[{"delta":{"content":"a"}}]}`+"\ndata: [DONE]\n"), nil)
	if err != nil || res.ContentChunks != 1 {
		t.Fatalf("nil onContent: %+v, %v", res, err)
	}
	boom := errors.New("boom")
	_, err = ReadStream(&failingReader{data: "data: {}\n", err: boom}, nil)
	var se *Error
	if !errors.Is(err, boom) || errors.As(err, &se) {
		t.Fatalf("read error: %v", err)
	}
}

// failingReader returns data, then err.
type failingReader struct {
	data string
	err  error
}

func (r *failingReader) Read(p []byte) (int, error) {
	if r.data == "" {
		return 0, r.err
	}
	n := copy(p, r.data)
	r.data = r.data[n:]
	return n, nil
}

func FuzzReadStream(f *testing.F) {
	f.Add("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n")
	f.Add("data: {\"error\":{\"message\":\"x\"}}\n")
	f.Add("data: {\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}\ndata: [DONE]\n")
	f.Add(": c\n\ndata:\n")
	f.Add("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"cacheblend\":{\"quality_sampled\":true,\"non_prefix_hit_tokens\":7}}}\n\ndata: [DONE]\n\n")
	f.Add("data:{\"choices\":[{\"delta\":{}}]}\n: comment\ndata: not json\n")
	f.Add("data: {\"usage\":{\"cacheblend\":null}}")
	f.Fuzz(func(t *testing.T, in string) {
		calls := 0
		res, err := ReadStream(strings.NewReader(in), func() { calls++ })
		if calls > 1 || (calls == 1) != (res.ContentChunks > 0) {
			t.Fatalf("onContent called %d times for %d content chunks", calls, res.ContentChunks)
		}
		if len(res.Deltas) != res.ContentChunks || slices.Contains(res.Deltas, "") {
			t.Fatalf("deltas %q for %d content chunks", res.Deltas, res.ContentChunks)
		}
		if cb := res.CacheBlend; cb != nil && (cb.PrefixHitTokens < 0 || cb.NonPrefixHitTokens < 0 || cb.RecomputedTokens < 0) {
			t.Fatalf("negative cacheblend usage %+v", *cb)
		}
		var se *Error
		if err != nil && !errors.As(err, &se) {
			t.Fatalf("unexpected error type %T: %v", err, err)
		}
		if res.PromptTokens < 0 || res.CompletionTokens < 0 {
			t.Fatalf("negative usage %+v", res)
		}
	})
}

func BenchmarkReadStream(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`data: {"id":"chatcmpl-1","choices":[{"delta":{"role":"assistant","content":""}}]}` + "\n\n")
	for range 64 {
		sb.WriteString(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"tok "},"finish_reason":null}]}` + "\n\n")
	}
	sb.WriteString(`data: {"id":"chatcmpl-1","choices":[],"usage":{"prompt_tokens":1800,"completion_tokens":64}}` + "\n\ndata: [DONE]\n\n")
	in := sb.String()
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ReadStream(strings.NewReader(in), nil); err != nil {
			b.Fatal(err)
		}
	}
}
