package gateway

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

const engineExposition = `# HELP cb_engine_requests_waiting Requests waiting in the scheduler queue.
# TYPE cb_engine_requests_waiting gauge
cb_engine_requests_waiting 3
# TYPE cb_engine_requests_running gauge
cb_engine_requests_running{} 5 1700000000000
cb_engine_kv_blocks{state="free"} 100
cb_engine_kv_blocks{state="used",x="a\"}b"} 28
cb_engine_kv_blocks{state="cached"} 0
cb_engine_kv_pool_blocks 128
gen_ai_server_request_duration_seconds_bucket{le="+Inf"} 7
`

func TestParseEngineGauges(t *testing.T) {
	g, err := parseEngineGauges(strings.NewReader(engineExposition))
	if err != nil {
		t.Fatal(err)
	}
	want := engineGauges{Has: true, Waiting: 3, Running: 5, KVFree: 100, KVUsed: 28, KVPool: 128}
	if g != want {
		t.Fatalf("got %+v, want %+v", g, want)
	}
	for _, bad := range []string{"", "cb_engine_requests_waiting 1\n", "cb_engine_requests_waiting NaN\ncb_engine_requests_running 1\n",
		"cb_engine_requests_waiting -1\ncb_engine_requests_running 1\n", "cb_engine_requests_waiting{ 1\ncb_engine_requests_running 1\n"} {
		if _, err := parseEngineGauges(strings.NewReader(bad)); !errors.Is(err, errBadMetrics) {
			t.Errorf("%q: %v, want errBadMetrics", bad, err)
		}
	}
	// A line over the limit is skipped, the rest read.
	long := "x " + strings.Repeat("9", maxMetricsLine) + "\ncb_engine_requests_waiting 1\ncb_engine_requests_running 2\n"
	if g, err := parseEngineGauges(strings.NewReader(long)); err != nil || g.Running != 2 {
		t.Fatalf("after a long line: %+v %v", g, err)
	}
	// A hostile engine repeating the gauges is refused beyond maxGaugeLines, whatever the body.
	flood := strings.Repeat("cb_engine_requests_waiting 1\n", maxGaugeLines) + "cb_engine_requests_running 2\n"
	if _, err := parseEngineGauges(strings.NewReader(flood)); !errors.Is(err, errBadMetrics) {
		t.Fatalf("flood of gauge lines: %v, want errBadMetrics", err)
	}
	// Other metrics, however many, are not kept.
	if g, err := parseEngineGauges(strings.NewReader("cb_engine_requests_waiting 1\ncb_engine_requests_running 2\n" + strings.Repeat("other_metric 1\n", 1000))); err != nil || g.Waiting != 1 {
		t.Fatalf("other metrics around the gauges: %+v %v", g, err)
	}
}

// FuzzParseEngineGauges: any exposition parses without panic, within its bounds.
func FuzzParseEngineGauges(f *testing.F) {
	f.Add([]byte(engineExposition))
	f.Add([]byte("cb_engine_requests_waiting 1e9\ncb_engine_requests_running 0x10\n"))
	f.Add([]byte("cb_engine_kv_blocks{state=\"free\\\\\",state=\"used\"} 1\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		g, err := parseEngineGauges(bytes.NewReader(b))
		if err != nil {
			if g != (engineGauges{}) {
				t.Fatalf("error with gauges %+v", g)
			}
			return
		}
		for _, v := range []int{g.Waiting, g.Running, g.KVFree, g.KVUsed, g.KVCached, g.KVPool} {
			if v < 0 || v >= 1<<31 {
				t.Fatalf("gauge %d out of range", v)
			}
		}
	})
}

const engineStream = "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n" +
	"data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}]}\n\n" +
	": a comment\n\n" +
	"data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n" +
	"data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":4,\"total_tokens\":13}}\n\n" +
	"data: [DONE]\n\n"

func TestSSEReader(t *testing.T) {
	sr := newSSEReader(strings.NewReader(engineStream))
	var got []sseEvent
	var raw []byte
	for {
		ev, err := sr.next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ev)
		raw = append(raw, ev.Raw...)
	}
	if string(raw) != engineStream {
		t.Fatalf("events do not reassemble the stream:\n%q", raw)
	}
	if len(got) != 6 || got[0].Content || !got[1].Content || got[2].Content || !got[3].Finish || !got[4].Usage ||
		got[4].CompletionTokens != 4 || !got[5].Done {
		t.Fatalf("events %+v", got)
	}
	ev := classifyEvent(nil, []byte(`{"error":{"message":"x","type":"server_error","param":null,"code":"worker_unavailable"}}`), true)
	if !ev.Error || ev.Code != "worker_unavailable" {
		t.Fatalf("error event %+v", ev)
	}
	ev = classifyEvent(nil, []byte(`{"id":"c","object":"text_completion","choices":[{"text":"abc","finish_reason":null}]}`), true)
	if !ev.Content || ev.Finish {
		t.Fatalf("completion chunk %+v", ev)
	}
	// A truncated last event is returned, then EOF; a line over the limit is an error.
	sr = newSSEReader(strings.NewReader("data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}"))
	if ev, err := sr.next(); err != nil || !ev.Content {
		t.Fatalf("truncated event %+v %v", ev, err)
	}
	if _, err := sr.next(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the last event: %v", err)
	}
	sr = newSSEReader(strings.NewReader("data: " + strings.Repeat("x", maxSSELine+1) + "\n\n"))
	if _, err := sr.next(); !errors.Is(err, errLineTooLong) {
		t.Fatalf("long line: %v", err)
	}
}

// FuzzSSE: any byte stream splits into events that reassemble it (up to line endings and
// blank-line runs) without panic.
func FuzzSSE(f *testing.F) {
	f.Add([]byte(engineStream))
	f.Add([]byte("data: [DONE]"))
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"content\":null},\"finish_reason\":1}],\"usage\":{\"completion_tokens\":-1}}\r\n\r\n"))
	f.Add([]byte("data:{\"error\":{\"code\":5}}\n\n\n\ndata: x\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		sr := newSSEReader(bytes.NewReader(b))
		total := 0
		for range len(b) + 1 {
			ev, err := sr.next()
			if err != nil {
				return
			}
			if len(ev.Raw) == 0 {
				t.Fatal("an empty event")
			}
			if ev.CompletionTokens < 0 {
				t.Fatalf("negative usage %+v", ev)
			}
			total += len(ev.Raw)
			if total > 2*len(b)+2 {
				t.Fatalf("events hold %d bytes of a %d-byte stream", total, len(b))
			}
		}
		t.Fatal("more events than bytes")
	})
}
