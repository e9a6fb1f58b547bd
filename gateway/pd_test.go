package gateway

import (
	"net/http"
	"testing"
)

// TestPrefillDecodeRouting: with Prefill and Decode, a generation goes to the prefill engine
// with X-CB-Decode-Engine naming a decode engine; a 503 decode_unavailable is retried on the
// same prefill engine with the other decode engine; the spans name the decode engine; a
// document ingest goes to the prefill engine without the header.
func TestPrefillDecodeRouting(t *testing.T) {
	p, d1, d2 := newFakeEngine(t), newFakeEngine(t), newFakeEngine(t)
	tg := startGateway(t, Config{Prefill: []string{p.srv.URL}, Decode: []string{d1.srv.URL, d2.srv.URL}})
	if got := tg.DecodeEngines(); len(got) != 2 || got[0] != d1.srv.URL {
		t.Fatalf("decode engines %v", got)
	}
	for _, stream := range []bool{false, true} {
		p.set(func(f *fakeEngine) { f.badDecode, f.decodeHdr = d1.srv.URL, nil })
		st, h, body := tg.post(t, "/v1/chat/completions", chatBody("hi", stream), nil)
		if st != http.StatusOK || h.Get(HeaderEngine) != p.name {
			t.Fatalf("stream %v: %d %v %s", stream, st, h, body)
		}
		p.mu.Lock()
		hdrs := p.decodeHdr
		p.mu.Unlock()
		if n := len(hdrs); n == 0 || hdrs[n-1] != d2.srv.URL || n == 2 && hdrs[0] != d1.srv.URL || n > 2 {
			t.Fatalf("stream %v: decode headers %v", stream, hdrs)
		}
		if r, _ := d1.count(); r != 0 {
			t.Fatalf("a decode engine got %d requests from the gateway", r)
		}
	}
	var found bool
	for _, s := range tg.spans.Ended() {
		if s.Name() != "gateway.request" {
			continue
		}
		for _, a := range s.Attributes() {
			if a.Key == "route.decode_engine" {
				found = a.Value.AsString() == d2.name
			}
		}
	}
	if !found {
		t.Fatal("gateway.request without route.decode_engine of the decode engine that served")
	}
	// No decode engine is up: the prefill engine serves the request whole (tested further in
	// TestDecodeDownServedWhole).
	p.set(func(f *fakeEngine) { f.badDecode = "*" })
	d1.set(func(f *fakeEngine) { f.health = http.StatusServiceUnavailable })
	d2.set(func(f *fakeEngine) { f.health = http.StatusServiceUnavailable })
	waitDown := func() bool {
		for _, s := range tg.decode.snapshot() {
			if s.up {
				return false
			}
		}
		return true
	}
	for !waitDown() {
		tg.checkAll(t.Context())
	}
	if st, h, body := tg.post(t, "/v1/chat/completions", chatBody("hi", false), nil); st != http.StatusOK || h.Get(HeaderEngine) != p.name {
		t.Fatalf("no decode engine: %d %s", st, body)
	}
	// A document ingest needs no decode engine.
	if st, _, body := tg.post(t, "/v1/documents", `{"documents":[{"id":"a","text":"some document"}]}`, nil); st != http.StatusOK {
		t.Fatalf("documents: %d %s", st, body)
	}
}

func TestPrefillDecodeConfig(t *testing.T) {
	for _, c := range []Config{
		{Prefill: []string{"127.0.0.1:1"}},
		{Decode: []string{"127.0.0.1:1"}},
		{Engines: []string{"127.0.0.1:3"}, Prefill: []string{"127.0.0.1:1"}, Decode: []string{"127.0.0.1:2"}},
		{Prefill: []string{"127.0.0.1:1"}, Decode: []string{"127.0.0.1:1"}},
	} {
		if _, err := c.withDefaults(); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}
