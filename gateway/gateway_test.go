package gateway

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/engine/api"
	"github.com/cacheblend/cacheblend/httpfront"
	"github.com/cacheblend/cacheblend/telemetry"
)

func TestForwardsAndStreams(t *testing.T) {
	a, b := newFakeEngine(t), newFakeEngine(t)
	tg := startGateway(t, Config{}, a, b)
	status, hdr, body := tg.post(t, api.RouteChat, chatBody("hello", false), nil)
	if status != 200 || !strings.Contains(body, "hello from "+hdr.Get(HeaderEngine)) || hdr.Get("X-Request-Id") == "" {
		t.Fatalf("non-streamed: %d %v %s", status, hdr, body)
	}
	status, hdr, body = tg.post(t, api.RouteChat, chatBody("hello", true), nil)
	if status != 200 || hdr.Get("Content-Type") != "text/event-stream" || !strings.HasSuffix(body, "data: [DONE]\n\n") ||
		strings.Count(body, "data: ") != 7 || !strings.Contains(body, `"role":"assistant"`) {
		t.Fatalf("streamed: %d %v\n%s", status, hdr, body)
	}
	status, _, body = tg.post(t, api.RouteCompletions, `{"model":"cb-llama","prompt":"hi","max_tokens":2}`, nil)
	if status != 200 {
		t.Fatalf("completion: %d %s", status, body)
	}
	resp, err := http.Get(tg.url + api.RouteModels)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("models: %v %v", err, resp)
	}
	resp.Body.Close()
	// The gateway's own metrics, as cb load reads them.
	if len(tg.metric(t, "gen_ai_server_request_duration_seconds_count", `gen_ai_operation_name="chat"`)) != 1 ||
		len(tg.metric(t, "gen_ai_server_time_to_first_token_seconds_count")) != 1 {
		t.Fatalf("GenAI metrics: %v", tg.metric(t, "gen_ai_server"))
	}
}

func TestBadRequestsAnsweredByTheGateway(t *testing.T) {
	a := newFakeEngine(t)
	tg := startGateway(t, Config{Settings: httpfront.Settings{APIKey: "k"}}, a)
	auth := map[string]string{"Authorization": "Bearer k"}
	for _, tc := range []struct {
		path, body string
		hdr        map[string]string
		status     int
		code       string
	}{
		{api.RouteChat, chatBody("x", false), nil, 401, "invalid_api_key"},
		{api.RouteChat, `{"model":"cb-llama","messages":[]}`, auth, 400, ""},
		{api.RouteChat, `not json`, auth, 400, ""},
		{"/v1/nothing", `{}`, auth, 404, "not_found"},
	} {
		status, _, body := tg.post(t, tc.path, tc.body, tc.hdr)
		if status != tc.status || !strings.Contains(body, `"error"`) || tc.code != "" && !strings.Contains(body, tc.code) {
			t.Errorf("%s %s: %d %s", tc.path, tc.body, status, body)
		}
	}
	resp, _ := http.Get(tg.url + api.RouteChat)
	if resp.StatusCode != 405 || resp.Header.Get("Allow") != "POST" {
		t.Errorf("GET chat: %v", resp.Status)
	}
	resp.Body.Close()
	if n, _ := a.count(); n != 0 {
		t.Fatalf("the engine saw %d bad requests", n)
	}
	// The client's key goes to the engine as it came.
	if status, _, _ := tg.post(t, api.RouteChat, chatBody("x", false), auth); status != 200 || a.auth[0] != "Bearer k" {
		t.Fatalf("authorized request: %d, engine saw %q", status, a.auth)
	}
}

func TestKVAwareKeepsDocumentsWhereTheyWere(t *testing.T) {
	a, b := newFakeEngine(t), newFakeEngine(t)
	tg := startGateway(t, Config{}, a, b)
	docs := []string{randomText(1, 1500), randomText(2, 1500), randomText(3, 1500), randomText(4, 1500)}
	home := map[int]string{}
	served := map[string]int{}
	for i := range 40 {
		d := (i*7 + i/4) % 4
		_, hdr, _ := tg.post(t, api.RouteChat, chatBody("Answer with these documents.\n\n"+docs[d]+"\n\nQuestion "+randomText(uint64(100+i), 40), false), nil)
		e := hdr.Get(HeaderEngine)
		served[e]++
		if h, ok := home[d]; !ok {
			home[d] = e
		} else if h != e {
			t.Errorf("request %d for document %d went to %s, its first request to %s", i, d, e, h)
		}
	}
	if served[a.name] > 26 || served[b.name] > 26 {
		t.Fatalf("documents not spread over the engines: %v", served)
	}
	if len(tg.metric(t, "cb_gateway_routing_decisions_total", `reason="reuse"`)) != 2 {
		t.Fatalf("decisions %v", tg.metric(t, "cb_gateway_routing_decisions_total"))
	}
}

// TestNewDocumentsSpreadOverIdleEngines: sequential requests over 4 documents on 2 idle
// engines put 2 documents on each, however often the first one is asked about before the
// others appear: a tie goes to the engine holding less KV, not the one asked fewer times.
func TestNewDocumentsSpreadOverIdleEngines(t *testing.T) {
	for _, tc := range []struct {
		name  string
		order []int
	}{
		{"round robin", []int{0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3}},
		{"first document repeated", []int{0, 0, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1}},
		{"in pairs", []int{0, 0, 1, 1, 2, 2, 3, 3, 0, 0, 1, 1, 2, 2, 3, 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := newFakeEngine(t), newFakeEngine(t)
			tg := startGateway(t, Config{}, a, b)
			docs := []string{randomText(11, 1500), randomText(12, 1500), randomText(13, 1500), randomText(14, 1500)}
			home := map[int]string{}
			for i, d := range tc.order {
				_, hdr, _ := tg.post(t, api.RouteChat, chatBody("Answer with this document.\n\n"+docs[d]+"\n\nQuestion "+randomText(uint64(200+i), 40), false), nil)
				e := hdr.Get(HeaderEngine)
				if h, ok := home[d]; !ok {
					home[d] = e
				} else if h != e {
					t.Errorf("request %d for document %d went to %s, its first request to %s", i, d, e, h)
				}
			}
			perEngine := map[string]int{}
			for _, e := range home {
				perEngine[e]++
			}
			if perEngine[a.name] != 2 || perEngine[b.name] != 2 {
				t.Fatalf("documents per engine %v, want 2 and 2", perEngine)
			}
		})
	}
}

func TestKVAwareSpreadsALoadedEngine(t *testing.T) {
	a, b := newFakeEngine(t), newFakeEngine(t)
	tg := startGateway(t, Config{SpreadMargin: 2}, a, b)
	doc := "Answer with this document.\n\n" + randomText(5, 1500)
	_, hdr, _ := tg.post(t, api.RouteChat, chatBody(doc+" Q1", false), nil)
	home, other := a, b
	if hdr.Get(HeaderEngine) == b.name {
		home, other = b, a
	}
	// The home engine reports 5 requests of other clients: beyond the margin, spread.
	home.set(func(f *fakeEngine) { f.running = 5 })
	time.Sleep(200 * time.Millisecond) // a few health checks
	_, hdr, _ = tg.post(t, api.RouteChat, chatBody(doc+" Q2", false), nil)
	if hdr.Get(HeaderEngine) != other.name {
		t.Fatalf("request went to %s, want the less loaded %s", hdr.Get(HeaderEngine), other.name)
	}
	if len(tg.metric(t, "cb_gateway_routing_decisions_total", `reason="spread"`, other.name)) != 1 {
		t.Fatalf("decisions %v", tg.metric(t, "cb_gateway_routing_decisions_total"))
	}
	// Now both hold the document: the less loaded one serves it, as a reuse.
	_, hdr, _ = tg.post(t, api.RouteChat, chatBody(doc+" Q3", false), nil)
	if hdr.Get(HeaderEngine) != other.name {
		t.Fatalf("request went to %s", hdr.Get(HeaderEngine))
	}
}

func TestFailover(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer int
		stream bool
		reason string
	}{
		{"503", answer503, false, "unavailable"},
		{"429", answer429, true, "queue_full"},
		{"cut before the body", answerDieBeforeText, false, "unreachable"},
		{"stream cut before content", answerDieBeforeText, true, "unreachable"},
		{"error event first", answerErrorEvent, true, "unavailable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad, good := newFakeEngine(t), newFakeEngine(t)
			bad.set(func(f *fakeEngine) { f.answer = tc.answer })
			tg := startGateway(t, Config{Policy: PolicyRoundRobin, HealthInterval: time.Hour}, bad, good)
			for range 2 { // round-robin: one of the two starts on the bad engine
				status, hdr, body := tg.post(t, api.RouteChat, chatBody("x", tc.stream), nil)
				if status != 200 || hdr.Get(HeaderEngine) != good.name || strings.Contains(body, "error") {
					t.Fatalf("%d from %s: %s", status, hdr.Get(HeaderEngine), body)
				}
			}
			// A full engine stays in routing (each request tries it first on its turn); one
			// that failed otherwise is out until its next health check (an hour here).
			want := 1
			if tc.answer == answer429 {
				want = 2
			}
			if n, _ := bad.count(); n != want {
				t.Fatalf("the bad engine saw %d requests, want %d", n, want)
			}
			if len(tg.metric(t, "cb_gateway_failovers_total", bad.name, `reason="`+tc.reason+`"`, fmt.Sprintf(" %d", want))) != 1 {
				t.Fatalf("failovers %v", tg.metric(t, "cb_gateway_failovers_total"))
			}
		})
	}
}

func TestStreamLostAfterItBegan(t *testing.T) {
	a := newFakeEngine(t)
	a.set(func(f *fakeEngine) { f.answer = answerDieAfterText })
	tg := startGateway(t, Config{}, a)
	status, _, body := tg.post(t, api.RouteChat, chatBody("x", true), nil)
	if status != 200 || !strings.Contains(body, `"content":"t0"`) || !strings.Contains(body, CodeEngineLost) ||
		!strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Fatalf("%d\n%s", status, body)
	}
	if len(tg.metric(t, "cb_gateway_attempts_total", `result="broken"`)) != 1 ||
		len(tg.metric(t, "gen_ai_server_request_duration_seconds_count", `error_type="worker_unavailable"`)) != 1 {
		t.Fatalf("metrics %v", tg.metric(t, "cb_gateway_attempts_total"))
	}
}

func TestNoEngine(t *testing.T) {
	a := newFakeEngine(t)
	a.set(func(f *fakeEngine) { f.health = 503 })
	tg := startGateway(t, Config{}, a)
	status, hdr, body := tg.post(t, api.RouteChat, chatBody("x", false), nil)
	if status != 503 || hdr.Get("Retry-After") == "" || !strings.Contains(body, CodeNoEngine) {
		t.Fatalf("%d %v %s", status, hdr, body)
	}
	resp, _ := http.Get(tg.url + api.RouteHealth)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("health %v", resp.Status)
	}
	resp.Body.Close()
	// The engine comes back: served again after a health check.
	a.set(func(f *fakeEngine) { f.health = 200 })
	deadline := time.Now().Add(5 * time.Second)
	for {
		if status, _, _ := tg.post(t, api.RouteChat, chatBody("x", false), nil); status == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("not served after the engine came back")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Every engine failing with 503: the engine's answer goes back, with Retry-After.
	a.set(func(f *fakeEngine) { f.answer = answer503 })
	status, hdr, body = tg.post(t, api.RouteChat, chatBody("x", false), nil)
	if status != 503 || hdr.Get("Retry-After") == "" || !strings.Contains(body, "worker_unavailable") {
		t.Fatalf("%d %v %s", status, hdr, body)
	}
}

func TestQueue(t *testing.T) {
	a := newFakeEngine(t)
	hold := make(chan struct{})
	a.set(func(f *fakeEngine) { f.hold = hold })
	tg := startGateway(t, Config{MaxInFlight: 1, MaxQueue: 1, QueueTimeout: 300 * time.Millisecond}, a)
	var wg sync.WaitGroup
	statuses := make(chan int, 2)
	for range 2 { // one in flight, one queued
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, _, _ := tg.post(t, api.RouteChat, chatBody("x", false), nil)
			statuses <- s
		}()
		time.Sleep(50 * time.Millisecond)
	}
	status, hdr, body := tg.post(t, api.RouteChat, chatBody("x", false), nil)
	if status != 429 || hdr.Get("Retry-After") == "" || !strings.Contains(body, CodeQueueFull) {
		t.Fatalf("queue full: %d %v %s", status, hdr, body)
	}
	time.Sleep(400 * time.Millisecond) // the queued one times out (503)
	close(hold)
	wg.Wait()
	got := []int{<-statuses, <-statuses}
	if !(got[0] == 503 && got[1] == 200 || got[0] == 200 && got[1] == 503) {
		t.Fatalf("statuses %v, want one 200 and one queue timeout", got)
	}
	if len(tg.metric(t, "cb_gateway_rejections_total", `reason="queue_full"`, " 1")) != 1 ||
		len(tg.metric(t, "cb_gateway_rejections_total", `reason="queue_timeout"`, " 1")) != 1 {
		t.Fatalf("rejections %v", tg.metric(t, "cb_gateway_rejections_total"))
	}
}

func TestQueuedRequestServedWhenASlotFrees(t *testing.T) {
	a := newFakeEngine(t)
	hold := make(chan struct{})
	a.set(func(f *fakeEngine) { f.hold = hold })
	tg := startGateway(t, Config{MaxInFlight: 1}, a)
	done := make(chan int, 2)
	for range 2 {
		go func() { s, _, _ := tg.post(t, api.RouteChat, chatBody("x", true), nil); done <- s }()
	}
	time.Sleep(100 * time.Millisecond)
	if len(tg.metric(t, "cb_gateway_queue_waiting 1")) != 1 {
		t.Fatalf("queue %v", tg.metric(t, "cb_gateway_queue_waiting"))
	}
	close(hold)
	if a, b := <-done, <-done; a != 200 || b != 200 {
		t.Fatalf("statuses %d %d", a, b)
	}
}

func TestOneTraceThroughTheGateway(t *testing.T) {
	a := newFakeEngine(t)
	tg := startGateway(t, Config{}, a)
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if status, _, _ := tg.post(t, api.RouteChat, chatBody("x", true), map[string]string{"traceparent": tp}); status != 200 {
		t.Fatal(status)
	}
	var server, attempt sdktrace.ReadOnlySpan
	for _, s := range tg.spans.Ended() {
		switch s.Name() {
		case spanname.GatewayRequest:
			server = s
		case spanname.GatewayAttempt:
			attempt = s
		}
	}
	if server == nil || attempt == nil {
		t.Fatalf("spans %v", tg.spans.Ended())
	}
	if server.SpanKind() != trace.SpanKindServer || server.Parent().SpanID().String() != "00f067aa0ba902b7" ||
		server.SpanContext().TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatalf("server span %v parent %v", server.SpanContext(), server.Parent())
	}
	if attempt.SpanKind() != trace.SpanKindClient || attempt.Parent().SpanID() != server.SpanContext().SpanID() {
		t.Fatalf("attempt span parent %v", attempt.Parent())
	}
	// The engine's traceparent names the attempt: its SERVER span is the attempt's remote child.
	sc := trace.SpanContextFromContext(telemetry.ExtractString(context.Background(), a.traceparent[0]))
	if sc.TraceID() != server.SpanContext().TraceID() || sc.SpanID() != attempt.SpanContext().SpanID() {
		t.Fatalf("engine got %s", a.traceparent[0])
	}
	attrs := map[string]string{}
	for _, kv := range server.Attributes() {
		attrs[string(kv.Key)] = kv.Value.Emit()
	}
	for _, k := range []string{"route.engine", "route.policy", "route.score", "route.expected_hit_tokens"} {
		if _, ok := attrs[k]; !ok {
			t.Errorf("server span lacks %s: %v", k, attrs)
		}
	}
	if attrs["route.engine"] != a.name || attrs["route.policy"] != PolicyKVAware {
		t.Fatalf("attributes %v", attrs)
	}
}

func TestDocumentsGoToOneEngineAndAreRemembered(t *testing.T) {
	a, b := newFakeEngine(t), newFakeEngine(t)
	tg := startGateway(t, Config{}, a, b)
	d := randomText(9, 1200)
	status, hdr, _ := tg.post(t, api.RouteDocuments, `{"documents":[{"id":"d","text":"`+d+`"}]}`, nil)
	if status != 200 {
		t.Fatal(status)
	}
	home := hdr.Get(HeaderEngine)
	for i := range 4 {
		_, h, _ := tg.post(t, api.RouteChat, chatBody("Use this: "+d+" question "+randomText(uint64(i), 20), false), nil)
		if h.Get(HeaderEngine) != home {
			t.Fatalf("request %d went to %s, the document to %s", i, h.Get(HeaderEngine), home)
		}
	}
}

func TestStreamIsFlushedAsItComes(t *testing.T) {
	a := newFakeEngine(t)
	tg := startGateway(t, Config{}, a)
	req, _ := http.NewRequest(http.MethodPost, tg.url+api.RouteChat, strings.NewReader(chatBody("x", true)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	events := 0
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: ") {
			events++
		}
	}
	if events != 7 {
		t.Fatalf("%d events", events)
	}
}

func TestHungEngineTakenOutOfRoutingFailsOver(t *testing.T) {
	hung, good := newFakeEngine(t), newFakeEngine(t)
	hold := make(chan struct{})
	defer close(hold)
	hung.set(func(f *fakeEngine) { f.hold = hold })
	tg := startGateway(t, Config{Policy: PolicyRoundRobin, HealthInterval: 50 * time.Millisecond}, hung, good)
	done := make(chan string, 2)
	for range 2 { // round-robin: one of them waits on the hung engine
		go func() {
			status, hdr, _ := tg.post(t, api.RouteChat, chatBody("x", true), nil)
			done <- fmt.Sprint(status, " ", hdr.Get(HeaderEngine))
		}()
	}
	time.Sleep(200 * time.Millisecond)
	// Its health check fails: the attempt waiting on it is cut and fails over.
	hung.set(func(f *fakeEngine) { f.health = 503 })
	for range 2 {
		select {
		case got := <-done:
			if got != "200 "+good.name {
				t.Fatalf("got %s, want 200 from %s", got, good.name)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a request hangs on the engine taken out of routing")
		}
	}
	if len(tg.metric(t, "cb_gateway_failovers_total", hung.name, `reason="unreachable"`)) != 1 {
		t.Fatalf("failovers %v", tg.metric(t, "cb_gateway_failovers_total"))
	}
}
