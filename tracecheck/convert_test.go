package tracecheck

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"reflect"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/tracestore"
	"github.com/cacheblend/cacheblend/tracestore/jaeger"
	"github.com/cacheblend/cacheblend/tracestore/tracetest"
)

func fixture() ptrace.Traces {
	td := tracetest.Request{RequestID: "conv"}.Traces()
	// Cover every value type and a status.
	forEach(td, func(s ptrace.Span) {
		if s.Name() == spanname.CBPartial {
			s.Attributes().PutEmptyBytes("blob").FromRaw([]byte{0, 1, 2, 255})
			s.Attributes().PutEmptySlice("list").AppendEmpty().SetStr("a")
			s.Status().SetCode(ptrace.StatusCodeError)
			s.Status().SetMessage("boom")
		}
	})
	return td
}

func forEach(td ptrace.Traces, f func(ptrace.Span)) {
	for i := 0; i < td.ResourceSpans().Len(); i++ {
		sss := td.ResourceSpans().At(i).ScopeSpans()
		for j := 0; j < sss.Len(); j++ {
			for k := 0; k < sss.At(j).Spans().Len(); k++ {
				f(sss.At(j).Spans().At(k))
			}
		}
	}
}

// listAsText turns the fixture's array attribute into its JSON text, which is what both
// ToPtrace and Jaeger's model keep of it.
func listAsText(ts []Trace) {
	for i := range ts[0].Spans {
		if v, ok := ts[0].Spans[i].Attributes["list"]; ok {
			ts[0].Spans[i].Attributes["list"] = Str(v.Str)
		}
	}
}

func TestPtraceRoundTrip(t *testing.T) {
	a := FromPtrace(fixture())
	if len(a) != 1 || len(a[0].Spans) != 22 {
		t.Fatalf("FromPtrace: %d traces", len(a))
	}
	b := FromPtrace(ToPtrace(a...))
	listAsText(a)
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("ptrace → Trace → ptrace → Trace changed the trace:\n%+v\n%+v", a[0].Spans[0], b[0].Spans[0])
	}
	sp := a[0].Spans[0]
	if sp.Name != "chat m1" || sp.Service != tracetest.Engine || sp.Kind != "server" || sp.ParentSpanID != "" || len(sp.TraceID) != 32 || len(sp.SpanID) != 16 {
		t.Fatalf("root = %+v", sp)
	}
}

// TestJaegerRoundTrip: spans through the store and the Jaeger JSON API come back equal
// (the fixture's times are whole microseconds).
func TestJaegerRoundTrip(t *testing.T) {
	td := fixture()
	want := FromPtrace(td)
	listAsText(want)
	store := tracestore.NewStore(tracestore.StoreConfig{})
	store.Add(td)
	srv := httptest.NewServer(tracestore.NewQueryHandler(store, nil))
	defer srv.Close()
	c, err := jaeger.NewClient(srv.URL, jaeger.ClientConfig{HTTPClient: srv.Client()})
	if err != nil {
		t.Fatal(err)
	}
	got, err := FromQuery(context.Background(), c, jaeger.Query{Service: tracetest.Engine})
	if err != nil {
		t.Fatal(err)
	}
	for i := range got {
		if got[i].Precision != time.Microsecond {
			t.Fatalf("trace %d read through the Jaeger API has precision %v, want 1µs", i, got[i].Precision)
		}
		want[i].Precision = time.Microsecond
	}
	if !reflect.DeepEqual(got, want) {
		for i := range want[0].Spans {
			if !reflect.DeepEqual(got[0].Spans[i], want[0].Spans[i]) {
				t.Fatalf("span %d differs after the Jaeger API:\n got %+v\nwant %+v", i, got[0].Spans[i], want[0].Spans[i])
			}
		}
		t.Fatalf("traces differ after the Jaeger API")
	}
	// A saved Jaeger response file reads the same.
	resp, err := srv.Client().Get(srv.URL + "/api/traces?service=cb-engine")
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	resp.Body.Close()
	fromFile, err := Parse(buf.Bytes())
	if err != nil || !reflect.DeepEqual(fromFile, want) {
		t.Fatalf("Parse(saved Jaeger JSON) = %v", err)
	}
	// In process, from the store, with full precision.
	inProc := FromStore(store, jaeger.Query{})
	listAsText(inProc)
	for i := range want {
		want[i].Precision = 0
	}
	if !reflect.DeepEqual(inProc, want) {
		t.Fatal("FromStore differs from the exported data")
	}
}

func TestParseOTLPJSON(t *testing.T) {
	td := fixture()
	doc, err := (&ptrace.JSONMarshaler{}).MarshalTraces(td)
	if err != nil {
		t.Fatal(err)
	}
	want := FromPtrace(td)
	got, err := ParseOTLPJSON(doc)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("ParseOTLPJSON(document): %v", err)
	}
	// JSON lines, as the collector's file exporter writes: one batch per service here.
	other := tracetest.Request{RequestID: "second"}.Traces()
	doc2, _ := (&ptrace.JSONMarshaler{}).MarshalTraces(other)
	lines := append(append(append([]byte{}, doc...), '\n'), doc2...)
	got, err = Parse(lines)
	if err != nil || len(got) != 2 {
		t.Fatalf("Parse(JSON lines) = %d traces, %v", len(got), err)
	}
	if rep := Check(got, spec(t)); rep.Traces[1].RequestID == "" {
		t.Fatalf("second trace lost its request id:\n%s", rep)
	}
}

func TestParseErrors(t *testing.T) {
	for name, in := range map[string]string{
		"empty":               "",
		"not json":            "hello",
		"json, not traces":    `{"foo": 1}`,
		"bad OTLP line":       "{\"resourceSpans\": []}\n{\"resourceSpans\": [",
		"jaeger bad int tag":  `{"data":[{"traceID":"01","spans":[{"traceID":"01","spanID":"02","tags":[{"key":"n","type":"int64","value":"x"}]}]}]}`,
		"jaeger bad binary":   `{"data":[{"traceID":"01","spans":[{"traceID":"01","spanID":"02","tags":[{"key":"b","type":"binary","value":"%%"}]}]}]}`,
		"OTLP with a bad id":  `{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"zz"}]}]}]}`,
		"array of non-traces": `[1, 2]`,
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := Parse([]byte(in)); err == nil {
				t.Fatal("accepted")
			} else if name != "jaeger bad int tag" && name != "jaeger bad binary" && !errors.Is(err, ErrFormat) {
				t.Fatalf("error %v does not wrap ErrFormat", err)
			}
		})
	}
}

func TestFromJaegerHandwritten(t *testing.T) {
	// A trace as a real Jaeger returns it: 64-bit-style short ids, error tag, logs.
	in := `{"data":[{"traceID":"abc","spans":[
	 {"traceID":"abc","spanID":"1","operationName":"chat m1","references":[],"startTime":1000,"duration":500,
	  "tags":[{"key":"span.kind","type":"string","value":"server"},{"key":"error","type":"bool","value":true},
	          {"key":"gen_ai.request.model","type":"string","value":"m1"},{"key":"n","type":"int64","value":7},
	          {"key":"f","type":"float64","value":0.25},{"key":"internal.span.format","type":"string","value":"otlp"}],
	  "logs":[{"timestamp":1200,"fields":[{"key":"event","type":"string","value":"first_token"},{"key":"i","type":"int64","value":1}]}],
	  "processID":"p1"},
	 {"traceID":"abc","spanID":"2","operationName":"child","references":[{"refType":"CHILD_OF","traceID":"abc","spanID":"1"}],
	  "startTime":1100,"duration":100,"tags":[],"processID":"p2"}],
	 "processes":{"p1":{"serviceName":"cb-engine","tags":[]},"p2":{"serviceName":"cb-blend","tags":[]}}}]}`
	got, err := ParseJaegerJSON([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	root, child := got[0].Spans[0], got[0].Spans[1]
	if root.TraceID != "00000000000000000000000000000abc" || root.SpanID != "0000000000000001" || !root.Error || root.Kind != "server" {
		t.Fatalf("root = %+v", root)
	}
	if len(root.Attributes) != 3 || root.Attributes["n"] != Int(7) || root.Attributes["f"] != Double(0.25) {
		t.Fatalf("attributes = %+v", root.Attributes)
	}
	if len(root.Events) != 1 || root.Events[0].Name != "first_token" || root.Events[0].Attributes["i"] != Int(1) || root.Events[0].Time.UnixMicro() != 1200 {
		t.Fatalf("events = %+v", root.Events)
	}
	if child.ParentSpanID != root.SpanID || child.Service != "cb-blend" || child.Duration().Microseconds() != 100 {
		t.Fatalf("child = %+v", child)
	}
	b, _ := json.Marshal(got) // the model is plain data
	if len(b) == 0 {
		t.Fatal("model does not marshal")
	}
}

// FuzzParse feeds arbitrary files to the parsers and the checker: no panic.
func FuzzParse(f *testing.F) {
	doc, _ := (&ptrace.JSONMarshaler{}).MarshalTraces(tracetest.Request{RequestID: "f"}.Traces())
	f.Add(doc)
	f.Add([]byte(`{"data":[{"traceID":"01","spans":[{"traceID":"01","spanID":"02","references":[{"refType":"CHILD_OF","spanID":"02"}]}]}]}`))
	f.Add([]byte("{\"resourceSpans\":[]}\n{\"resourceSpans\":[]}"))
	sp := spec(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		traces, err := Parse(data)
		if err != nil {
			return
		}
		rep := Check(traces, sp)
		_ = rep.String()
	})
}
