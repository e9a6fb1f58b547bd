package contract

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestEmbeddedFilesLoad(t *testing.T) {
	inst, err := Instruments()
	if err != nil {
		t.Fatalf("Instruments: %v", err)
	}
	spans, err := Spans()
	if err != nil {
		t.Fatalf("Spans: %v", err)
	}
	slos, err := SLOs()
	if err != nil {
		t.Fatalf("SLOs: %v", err)
	}
	if len(inst.Instruments) < 50 || len(spans.Spans) < 20 || len(slos.Objectives) != 4 {
		t.Fatalf("unexpected sizes: %d instruments, %d spans, %d objectives",
			len(inst.Instruments), len(spans.Spans), len(slos.Objectives))
	}
	// The raw accessors return copies of what the loaders parse.
	for name, raw := range map[string][]byte{"instruments": InstrumentsYAML(), "spans": SpansYAML(), "slo": SLOYAML()} {
		if len(raw) == 0 {
			t.Errorf("%s: empty raw bytes", name)
		}
		raw[0] = 'X' // must not affect the embedded file
	}
	if _, err := Instruments(); err != nil {
		t.Fatalf("Instruments after mutating a copy: %v", err)
	}
}

func TestInstrumentsHaveTheBriefedShape(t *testing.T) {
	set, err := Instruments()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		kind    Kind
		labels  []string
		buckets []float64
	}{
		{"gen_ai_server_time_to_first_token_seconds", Histogram, []string{"gen_ai_operation_name", "gen_ai_request_model"},
			[]float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0}},
		{"gen_ai_server_time_per_output_token_seconds", Histogram, []string{"gen_ai_operation_name", "gen_ai_request_model"},
			[]float64{0.01, 0.025, 0.05, 0.06, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5}},
		{"gen_ai_server_request_duration_seconds", Histogram, []string{"gen_ai_operation_name", "gen_ai_request_model", "error_type"},
			[]float64{0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92}},
		{"http_server_request_duration_seconds", Histogram, []string{"http_request_method", "http_route", "http_response_status_code"},
			[]float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}},
		{"cb_engine_kv_blocks", Gauge, []string{"state"}, nil},
		{"cb_engine_lookup_fallbacks_total", Counter, []string{"reason"}, nil},
		{"lmcache_blend_l2_load_throughput_gbps", Histogram, nil, []float64{0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32}},
		{"cb_build_info", Gauge, []string{"service", "version"}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in, ok := set.Lookup(tc.name)
			if !ok {
				t.Fatal("missing")
			}
			if in.Type != tc.kind || !slices.Equal(in.LabelKeys(), tc.labels) && len(tc.labels)+len(in.Labels) > 0 || !slices.Equal(in.Buckets, tc.buckets) {
				t.Fatalf("got %s %v %v", in.Type, in.LabelKeys(), in.Buckets)
			}
		})
	}
	if in, _ := set.Lookup("gen_ai_server_request_duration_seconds"); !in.Labels[2].Allows("") || in.Labels[2].Allows("bogus") {
		t.Error("error_type must allow \"\" and refuse unknown values")
	}
	if in, _ := set.Lookup("gen_ai_server_time_to_first_token_seconds"); in.PromUnit() != "seconds" || !in.Exemplars {
		t.Errorf("TTFT unit %q exemplars %v", in.PromUnit(), in.Exemplars)
	}
	for _, owner := range knownOwners {
		if len(set.Owned(owner)) == 0 {
			t.Errorf("no instruments owned by %s", owner)
		}
	}
}

// TestSLOThresholdsAreBucketBounds enforces that every latency objective's threshold is
// exactly one of its histogram's bucket bounds, so the SLI is read from one bucket.
func TestSLOThresholdsAreBucketBounds(t *testing.T) {
	inst, err := Instruments()
	if err != nil {
		t.Fatal(err)
	}
	slos, err := SLOs()
	if err != nil {
		t.Fatal(err)
	}
	latency := 0
	for _, o := range slos.Objectives {
		in, ok := inst.Lookup(o.Metric)
		if !ok || in.Type != Histogram {
			t.Fatalf("%s: metric %s not a contract histogram", o.Name, o.Metric)
		}
		if o.Kind != Latency {
			continue
		}
		latency++
		if !slices.Contains(in.Buckets, o.Threshold) {
			t.Errorf("%s: threshold %v is not a bucket bound of %s %v", o.Name, o.Threshold, o.Metric, in.Buckets)
		}
	}
	if latency != 3 {
		t.Fatalf("want 3 latency-kind objectives (ttft, tpot, quality), got %d", latency)
	}
	want := map[string][3]any{
		"ttft":         {"gen_ai_server_time_to_first_token_seconds", 0.5, 0.95},
		"tpot":         {"gen_ai_server_time_per_output_token_seconds", 0.06, 0.95},
		"quality":      {"lmcache_blend_quality_kl", 0.01, 0.95},
		"availability": {"http_server_request_duration_seconds", 0.0, 0.995},
	}
	for name, w := range want {
		o, ok := slos.Lookup(name)
		if !ok || o.Metric != w[0] || o.Threshold != w[1] || o.Target != w[2] {
			t.Errorf("%s: got %+v", name, o)
		}
	}
	if slos.Window != 30*24*time.Hour {
		t.Errorf("window %v", slos.Window)
	}
	if len(slos.BurnRateAlerts) != 4 || slos.BurnRateAlerts[0].LongWindow != time.Hour || slos.BurnRateAlerts[0].ShortWindow != 5*time.Minute {
		t.Errorf("burn-rate alerts %+v", slos.BurnRateAlerts)
	}
}

func TestSpanTree(t *testing.T) {
	set, err := Spans()
	if err != nil {
		t.Fatal(err)
	}
	root, ok := set.Root(TraceRequest)
	if !ok || root.Kind != KindServer || root.Service != "cb-engine" {
		t.Fatalf("request root %+v", root)
	}
	for _, name := range []string{"chat m1", "text_completion llama 3"} {
		if sp, ok := set.Match(name); !ok || sp != root {
			t.Errorf("Match(%q) = %v", name, sp)
		}
	}
	if sp, ok := set.Match("cb.scatter"); !ok || sp.Name != "cb.scatter" {
		t.Errorf("Match(cb.scatter) = %v", sp)
	}
	if _, ok := set.Match("embeddings m1"); ok {
		t.Error("an unknown operation must not match the root")
	}
	if ing, ok := set.Root(TraceIngest); !ok || ing.Name != "cb.store_pre_computed" {
		t.Errorf("ingest root %+v", ing)
	}
	// Remote children: exactly the spans whose context crossed an RPC.
	var remote []string
	for _, sp := range set.Spans {
		if sp.RemoteParent {
			remote = append(remote, sp.Name)
		}
		if strings.HasPrefix(sp.Name, "cb.") && sp.Attributes["request_id"] != AttrString {
			t.Errorf("%s: no request_id", sp.Name)
		}
	}
	if want := []string{"cb.lookup", "cb.execute", "cb.retrieve", "cb.store", "kv.receive"}; !slices.Equal(remote, want) {
		t.Errorf("remote children %v, want %v", remote, want)
	}
	for name, parent := range map[string]string{
		"cb.lookup": "cb.lookup.rpc", "cb.l2_load": "cb.sparse_prefetch", "cb.scatter": "cb.retrieve",
		"cb.check": "cb.model_forward", "engine.decode": "{operation} {model}", "cb.request": "{operation} {model}",
	} {
		if sp, ok := set.Lookup(name); !ok || sp.Parent != parent {
			t.Errorf("%s: parent %v, want %s", name, sp, parent)
		}
	}
	for _, name := range []string{"cb.start_load_kv", "cb.retrieve", "cb.scatter"} {
		if sp, _ := set.Lookup(name); !sp.MayRepeat {
			t.Errorf("%s must may_repeat", name)
		}
	}
	l2, _ := set.Lookup("cb.l2_load")
	if l2.Required || l2.When == nil || !l2.When.Holds(3) || l2.When.Holds(0) {
		t.Errorf("cb.l2_load condition %+v", l2.When)
	}
	cm, _ := set.Lookup("cb.coordinator_match")
	if cm.Required || cm.AlternativeTo != "cb.fingerprint_match" {
		t.Errorf("cb.coordinator_match %+v", cm)
	}
	// The contract's token-granular scatter statistics on cb.scatter and cb.retrieve.
	for _, name := range []string{"cb.scatter", "cb.retrieve"} {
		sc, _ := set.Lookup(name)
		if got := sc.AttributeKeys(); !slices.Equal(got, []string{"dropped", "n_prefix_tokens", "n_shifted_tokens", "partial_blocks",
			"request_id", "scatter_ms", "scattered_tokens", "slot_writes"}) {
			t.Errorf("%s attributes %v", name, got)
		}
	}
	req, _ := set.Lookup("cb.request")
	if got := req.AttributeKeys(); !slices.Equal(got, []string{"fingerprint_hits", "hit_rate", "hit_tokens", "lookup", "model",
		"n_non_prefix_tokens", "n_prompt_tokens", "non_prefix_hit_tokens", "prefix_coverage_tokens", "prefix_hit_tokens",
		"request_id", "requested_tokens", "stale_chunks", "storage_hits", "world_size"}) {
		t.Errorf("cb.request attributes %v", got)
	}
	// The lookup subtree is required by the lookup attribute of cb.request.
	rpc, _ := set.Lookup("cb.lookup.rpc")
	if rpc.Required || rpc.When == nil || rpc.When.HoldsText("skipped") || !rpc.When.HoldsText("timeout") || rpc.When.Holds(0) {
		t.Errorf("cb.lookup.rpc condition %+v", rpc.When)
	}
	lk, _ := set.Lookup("cb.lookup")
	if lk.Required || lk.When == nil || !lk.When.HoldsText("done") || lk.When.HoldsText("unavailable") {
		t.Errorf("cb.lookup condition %+v", lk.When)
	}
	// Only asynchronous follow-up work may outlive its parent.
	var async []string
	for _, sp := range set.Spans {
		if sp.Async {
			async = append(async, sp.Name)
		}
	}
	if !slices.Equal(async, []string{"cb.store"}) {
		t.Errorf("async spans %v, want [cb.store]", async)
	}
	if got := len(set.Children("cb.lookup")); got != 5 {
		t.Errorf("cb.lookup has %d children, want 5", got)
	}
	// The phases the trace page groups by (tracestore's breakdown).
	for name, phase := range map[string]Phase{
		"{operation} {model}": PhaseRequest, "engine.queue": PhaseQueue, "engine.prefill": PhasePrefill,
		"engine.decode": PhaseDecode, "cb.request": PhaseSchedule, "cb.build_meta": PhaseSchedule,
		"cb.lookup.rpc": PhaseLookup, "cb.coordinator_match": PhaseLookup, "cb.l2_load": PhaseL2Load,
		"cb.execute": PhaseExecute, "cb.scatter": PhaseKVLoad, "cb.partial": PhaseForward,
		"cb.store": PhaseStore, "cb.store_pre_computed": PhaseStore,
	} {
		if sp, ok := set.Lookup(name); !ok || sp.Phase != phase {
			t.Errorf("%s: phase %v, want %q", name, sp, phase)
		}
	}
	if !slices.Equal(set.Traces(), []string{TraceIngest, TraceQuality, TraceRequest}) {
		t.Errorf("traces %v", set.Traces())
	}
}

const goodInstrument = `version: 1
instruments:
  - name: x_seconds
    type: histogram
    help: X.
    unit: s
    owners: [engine]
    labels:
      - key: op
        allowed: [chat]
    buckets: [0.1, 0.5, 1.0]
`

func TestParseInstrumentsRejects(t *testing.T) {
	if _, err := ParseInstruments([]byte(goodInstrument)); err != nil {
		t.Fatalf("base document: %v", err)
	}
	tests := []struct {
		name, old, new, want string
	}{
		{"not yaml", "version: 1", "version: [1", "yaml"},
		{"unknown field", "    unit: s", "    unit: s\n    colour: red", "colour"},
		{"bad version", "version: 1", "version: 2", "version"},
		{"counter without _total", "type: histogram", "type: counter", "_total"},
		{"gauge with _total", "name: x_seconds\n    type: histogram", "name: x_seconds_total\n    type: gauge", "only counter"},
		{"unknown type", "type: histogram", "type: summary", "not counter"},
		{"camel case", "name: x_seconds", "name: xSeconds", "snake_case"},
		{"reserved suffix", "name: x_seconds", "name: x_seconds_count", "reserved"},
		{"unit without suffix", "unit: s", "unit: By", "_bytes"},
		{"suffix without unit", "unit: s", "unit: \"{thing}\"", "requires unit s"},
		{"unknown unit", "unit: s", "unit: ms", "unit"},
		{"bounds not increasing", "[0.1, 0.5, 1.0]", "[0.1, 0.5, 0.5]", "strictly increasing"},
		{"bounds decreasing", "[0.1, 0.5, 1.0]", "[0.5, 0.1]", "strictly increasing"},
		{"infinite bound", "[0.1, 0.5, 1.0]", "[0.1, .inf]", "finite"},
		{"nan bound", "[0.1, 0.5, 1.0]", "[0.1, .nan]", "finite"},
		{"negative bound", "[0.1, 0.5, 1.0]", "[-1, 0.5]", "positive"},
		{"no buckets", "    buckets: [0.1, 0.5, 1.0]\n", "", "without buckets"},
		{"buckets on gauge", "name: x_seconds\n    type: histogram", "name: x_seconds\n    type: gauge", "buckets on"},
		{"label key invalid", "key: op", "key: Op-Name", "label key"},
		{"label key reserved", "key: op", "key: le", "reserved"},
		{"label key dunder", "key: op", "key: __op", "reserved"},
		{"label without policy", "        allowed: [chat]", "", "allowed list or capped"},
		{"label with both", "        allowed: [chat]", "        allowed: [chat]\n        capped: true", "both"},
		{"duplicate allowed value", "[chat]", "[chat, chat]", "twice"},
		{"other reserved", "[chat]", "[chat, _other]", "reserved"},
		{"duplicate label", "        allowed: [chat]", "        allowed: [chat]\n      - key: op\n        capped: true", "twice"},
		{"unknown owner", "[engine]", "[router]", "owner"},
		{"no owners", "    owners: [engine]\n", "", "no owners"},
		{"empty help", "help: X.", "help: \"\"", "empty help"},
		{"help with newline", "help: X.", "help: \"a\\nb\"", "one line"},
		{"exemplars on gauge", "name: x_seconds\n    type: histogram\n    help: X.\n    unit: s\n    owners: [engine]\n    labels:\n      - key: op\n        allowed: [chat]\n    buckets: [0.1, 0.5, 1.0]",
			"name: x_seconds\n    type: gauge\n    help: X.\n    unit: s\n    owners: [engine]\n    exemplars: true", "exemplars"},
		{"duplicate name", "instruments:\n", "instruments:\n  - {name: x_seconds, type: gauge, help: Y., unit: s, owners: [engine]}\n", "duplicate name"},
		{"histogram series collision", "instruments:\n", "instruments:\n  - {name: x_seconds_bucket, type: gauge, help: Y., unit: \"{b}\", owners: [engine]}\n", "collides"},
		{"two documents", "buckets: [0.1, 0.5, 1.0]\n", "buckets: [0.1, 0.5, 1.0]\n---\nversion: 1\n", "more than one"},
		{"empty", goodInstrument, "", "empty"},
		{"no instruments", goodInstrument, "version: 1\ninstruments: []\n", "no instruments"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			doc := strings.Replace(goodInstrument, tc.old, tc.new, 1)
			if doc == goodInstrument {
				t.Fatalf("test case did not change the document")
			}
			set, err := ParseInstruments([]byte(doc))
			if err == nil {
				t.Fatalf("accepted:\n%s\n%+v", doc, set)
			}
			var ve *ValidationError
			if !errors.Is(err, ErrInvalid) || !errors.As(err, &ve) {
				t.Fatalf("error %v is not a *ValidationError wrapping ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not mention %q", err, tc.want)
			}
		})
	}
}

const goodSpans = `version: 1
services: [a, b]
spans:
  - name: root
    service: a
    kind: server
    phase: request
    required: true
  - name: cb.child
    service: a
    kind: internal
    phase: schedule
    parent: root
    required: true
    attributes: {request_id: string, n: int}
  - name: cb.remote
    service: b
    kind: server
    phase: "kv load"
    parent: cb.child
    remote_parent: true
    required: false
    when: {span: cb.child, attribute: n, op: gt, value: 0}
    attributes: {request_id: string}
`

func TestParseSpansRejects(t *testing.T) {
	if _, err := ParseSpans([]byte(goodSpans)); err != nil {
		t.Fatalf("base document: %v", err)
	}
	tests := []struct {
		name, old, new, want string
	}{
		{"not yaml", "spans:", "spans: [", "yaml"},
		{"unknown field", "    kind: server", "    kind: server\n    colour: red", "colour"},
		{"missing parent", "parent: root", "parent: nowhere", "does not exist"},
		{"two roots", "    parent: root\n", "", "want exactly one"},
		{"cycle", "  - name: root\n    service: a\n    kind: server\n    phase: request\n    required: true",
			"  - name: root\n    service: a\n    kind: server\n    phase: store\n    parent: cb.remote\n    required: true", "cycle"},
		{"unknown service", "service: b", "service: c", "service"},
		{"unknown kind", "kind: internal", "kind: producer", "kind"},
		{"bad attribute type", "n: int", "n: float", "type"},
		{"bad attribute key", "n: int", "N-x: int", "attribute key"},
		{"cb span without request_id", "attributes: {request_id: string}", "attributes: {x: string}", "request_id"},
		{"remote_parent missing", "    remote_parent: true\n", "", "remote_parent"},
		{"remote_parent wrong", "    parent: root\n", "    parent: root\n    remote_parent: true\n", "remote_parent"},
		{"condition on unknown span", "when: {span: cb.child", "when: {span: cb.nothing", "does not exist"},
		{"condition on unknown attribute", "attribute: n,", "attribute: m,", "not an attribute"},
		{"condition on string", "attribute: n,", "attribute: request_id,", "not numeric"},
		{"condition op", "op: gt", "op: greater", "when.op"},
		{"required with when", "    required: false\n    when", "    required: true\n    when", "takes no when"},
		{"bad pattern", "  - name: root\n", "  - name: root\n    name_pattern: '('\n", "name_pattern"},
		{"pattern overlaps", "  - name: root\n", "  - name: root\n    name_pattern: '^cb\\..*$'\n", "also matches"},
		{"duplicate span", "  - name: cb.remote", "  - name: cb.child", "duplicate"},
		{"alternative not sibling", "    when: {span: cb.child, attribute: n, op: gt, value: 0}\n", "    alternative_to: cb.child\n", "not a sibling"},
		{"parent in other trace", "  - name: cb.remote\n", "  - name: cb.remote\n    trace: ingest\n", "trace"},
		{"no services", "services: [a, b]", "services: []", "no services"},
		{"no phase", "    phase: schedule\n", "", "no phase"},
		{"unknown phase", "phase: schedule", "phase: compute", "phase \"compute\" is not one of"},
		{"phase request off a root", "phase: schedule", "phase: request", "reserved for the root"},
		{"string condition on a number", "attribute: n, op: gt, value: 0", "attribute: n, op: eq, value: done", "is a string but"},
		{"string condition with an order", "attribute: n, op: gt, value: 0", "attribute: request_id, op: gt, value: done", "does not compare strings"},
		{"condition value neither number nor string", "value: 0}", "value: true}", "not a number or a string"},
		{"condition value a list", "value: 0}", "value: [0]}", "must be a number or a string"},
		{"async root", "    phase: request\n", "    phase: request\n    async: true\n", "async needs a parent"},
		{"async not a bool", "    remote_parent: true\n", "    remote_parent: true\n    async: maybe\n", "into bool"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			doc := strings.Replace(goodSpans, tc.old, tc.new, 1)
			if doc == goodSpans {
				t.Fatal("test case did not change the document")
			}
			_, err := ParseSpans([]byte(doc))
			if err == nil {
				t.Fatalf("accepted:\n%s", doc)
			}
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q: want ErrInvalid mentioning %q", err, tc.want)
			}
		})
	}
}

// goodOther is goodSpans with an ingest trace whose root cb.doc is cb.remote's
// other parent (in service a: cb.remote is its remote child too).
var goodOther = goodSpans + `  - name: cb.doc
    trace: ingest
    service: a
    kind: internal
    phase: store
    attributes: {request_id: string}
  - name: cb.leaf
    service: b
    kind: internal
    phase: forward
    parent: cb.remote
    attributes: {request_id: string}
`

// TestOtherParents: a span with other_parents (and its subtree) belongs to the
// trace of each other parent too, under that parent there.
func TestOtherParents(t *testing.T) {
	doc := strings.Replace(goodOther, "    remote_parent: true\n", "    other_parents: [cb.doc]\n    remote_parent: true\n", 1)
	set, err := ParseSpans([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	remote, _ := set.Lookup("cb.remote")
	leaf, _ := set.Lookup("cb.leaf")
	child, _ := set.Lookup("cb.child")
	for _, tc := range []struct {
		name         string
		sp           *Span
		trace        string
		in           bool
		wantParentIn string
	}{
		{"own trace", remote, TraceRequest, true, "cb.child"},
		{"other parent's trace", remote, TraceIngest, true, "cb.doc"},
		{"subtree inherits", leaf, TraceIngest, true, "cb.remote"},
		{"subtree keeps its own", leaf, TraceRequest, true, "cb.remote"},
		{"parent not in it", child, TraceIngest, false, "root"},
	} {
		if got := tc.sp.InTrace(tc.trace); got != tc.in {
			t.Errorf("%s: %s.InTrace(%s) = %v, want %v", tc.name, tc.sp.Name, tc.trace, got, tc.in)
		}
		if got := set.ParentIn(tc.sp, tc.trace); got != tc.wantParentIn {
			t.Errorf("%s: ParentIn(%s, %s) = %q, want %q", tc.name, tc.sp.Name, tc.trace, got, tc.wantParentIn)
		}
	}
	if got := set.Children("cb.doc"); len(got) != 1 || got[0] != remote {
		t.Errorf("Children(cb.doc) = %v", got)
	}
	// The embedded contract: the worker's spans of a document ingest are in the ingest trace.
	real, err := Spans()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"cb.execute", "cb.model_forward", "cb.store"} {
		if sp, _ := real.Lookup(name); !sp.InTrace(TraceIngest) || !sp.InTrace(TraceRequest) {
			t.Errorf("%s: traces %v, want request and ingest", name, sp.TraceNames())
		}
	}
	if sp, _ := real.Lookup("cb.request"); sp.InTrace(TraceIngest) {
		t.Error("cb.request must not be in the ingest trace")
	}
	ga, _ := real.Lookup("gateway.attempt")
	if ga.OptionalAttributes["gateway.abandoned"] != AttrBool {
		t.Errorf("gateway.attempt: gateway.abandoned %q, want bool", ga.OptionalAttributes["gateway.abandoned"])
	}
	for _, tc := range []struct{ name, old, new, want string }{
		{"unknown other parent", "    remote_parent: true\n", "    other_parents: [cb.none]\n    remote_parent: true\n", "does not exist"},
		{"other parent in the same trace", "    remote_parent: true\n", "    other_parents: [root]\n    remote_parent: true\n", "already has a parent in"},
		{"other parent locality", "    parent: cb.remote\n", "    parent: cb.remote\n    other_parents: [cb.doc]\n", "remote_parent"},
		{"other parents on a root", "  - name: root\n", "  - name: root\n    other_parents: [cb.doc]\n", "on a root"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := strings.Replace(goodOther, tc.old, tc.new, 1)
			if bad == goodOther {
				t.Fatal("test case did not change the document")
			}
			if _, err := ParseSpans([]byte(bad)); err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v: want ErrInvalid mentioning %q", err, tc.want)
			}
		})
	}
}

// goodCaller is goodSpans with a caller service above its root.
var goodCaller = strings.Replace(goodSpans, "services: [a, b]", "services: [a, b, gw]", 1) + `  - name: gw.in
    service: gw
    kind: server
    phase: request
    caller: true
    required: false
  - name: gw.out
    service: gw
    kind: client
    phase: route
    parent: gw.in
    caller: true
    required: true
    calls: [root]
`

func TestCallerSpans(t *testing.T) {
	set, err := ParseSpans([]byte(goodCaller))
	if err != nil {
		t.Fatalf("base document: %v", err)
	}
	if root, ok := set.Root(TraceRequest); !ok || root.Name != "root" {
		t.Fatalf("root %+v: a caller span is never a trace's root", root)
	}
	if out, _ := set.Lookup("gw.out"); !out.Caller || !slices.Equal(out.Calls, []string{"root"}) {
		t.Fatalf("gw.out %+v", out)
	}
	tests := []struct {
		name, old, new, want string
	}{
		{"calls a non-root", "calls: [root]", "calls: [cb.child]", "not the root"},
		{"calls nothing", "calls: [root]", "calls: [nowhere]", "does not exist"},
		{"calls twice", "calls: [root]", "calls: [root, root]", "twice"},
		{"calls own service", "  - name: root\n    service: a", "  - name: root\n    service: gw", "own service"},
		{"calls without caller", "    caller: true\n    required: true\n    calls", "    required: true\n    calls", "not a caller"},
		{"caller parent of a contract span", "    parent: root\n", "    parent: gw.in\n", "caller span"},
		{"caller with when", "    caller: true\n    required: false\n", "    caller: true\n    required: false\n    when: {span: cb.child, attribute: n, op: gt, value: 0}\n", "no when"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			doc := strings.Replace(goodCaller, tc.old, tc.new, 1)
			if doc == goodCaller {
				t.Fatal("test case did not change the document")
			}
			_, err := ParseSpans([]byte(doc))
			if err == nil {
				t.Fatalf("accepted:\n%s", doc)
			}
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q: want ErrInvalid mentioning %q", err, tc.want)
			}
		})
	}
}

const goodSLO = `version: 1
window: 30d
objectives:
  - name: lat
    description: fast.
    kind: latency
    metric: x_seconds
    threshold: 0.5
    target: 0.95
  - name: avail
    description: up.
    kind: availability
    metric: x_seconds
    target: 0.995
    bad:
      - {label: op, op: "=", value: chat}
burn_rate_alerts:
  - {severity: page, long_window: 1h, short_window: 5m, factor: 14.4}
`

func TestParseSLOsRejects(t *testing.T) {
	inst, err := ParseInstruments([]byte(goodInstrument))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParseSLOs([]byte(goodSLO), inst); err != nil {
		t.Fatalf("base document: %v", err)
	}
	tests := []struct {
		name, old, new, want string
	}{
		{"not yaml", "objectives:", "objectives: [", "yaml"},
		{"unknown field", "    target: 0.95", "    target: 0.95\n    colour: red", "colour"},
		{"threshold not a bound", "threshold: 0.5", "threshold: 0.4", "not a bucket bound"},
		{"unknown metric", "metric: x_seconds\n    threshold", "metric: y_seconds\n    threshold", "not in"},
		{"latency without threshold", "    threshold: 0.5\n", "", "threshold"},
		{"availability with threshold", "    target: 0.995\n", "    target: 0.995\n    threshold: 0.5\n", "no threshold"},
		{"availability without bad", "    bad:\n      - {label: op, op: \"=\", value: chat}\n", "", "bad matchers"},
		{"target one", "target: 0.95", "target: 1", "target"},
		{"target zero", "target: 0.95", "target: 0", "target"},
		{"unknown kind", "kind: latency", "kind: throughput", "kind"},
		{"bad window", "window: 30d", "window: thirty", "window"},
		{"bad matcher op", `op: "="`, `op: "=="`, "matcher op"},
		{"bad regex", `op: "=", value: chat`, `op: "=~", value: "("`, "matcher"},
		{"unknown label", "label: op", "label: route", "not a label"},
		{"value not allowed", "value: chat", "value: embed", "not an allowed value"},
		{"short window not shorter", "short_window: 5m", "short_window: 2h", "shorter"},
		{"factor never fires", "factor: 14.4", "factor: 30", "never fire"},
		{"long window beyond slo", "long_window: 1h", "long_window: 40d", "exceeds"},
		{"duplicate objective", "name: avail", "name: lat", "twice"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			doc := strings.Replace(goodSLO, tc.old, tc.new, 1)
			if doc == goodSLO {
				t.Fatal("test case did not change the document")
			}
			_, err := ParseSLOs([]byte(doc), inst)
			if err == nil {
				t.Fatalf("accepted:\n%s", doc)
			}
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q: want ErrInvalid mentioning %q", err, tc.want)
			}
		})
	}
}

func FuzzParseInstruments(f *testing.F) {
	f.Add(instrumentsYAML)
	f.Add([]byte(goodInstrument))
	f.Add([]byte("version: 1\ninstruments: [{name: a_total, type: counter}]"))
	f.Add([]byte("&a [*a]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		set, err := ParseInstruments(data)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		for _, in := range set.Instruments {
			for i := 1; i < len(in.Buckets); i++ {
				if !(in.Buckets[i] > in.Buckets[i-1]) {
					t.Fatalf("%s: accepted non-increasing buckets %v", in.Name, in.Buckets)
				}
			}
			if got, ok := set.Lookup(in.Name); !ok || got.Name != in.Name {
				t.Fatalf("Lookup(%q) failed", in.Name)
			}
		}
	})
}

func FuzzParseSpans(f *testing.F) {
	f.Add(spansYAML)
	f.Add([]byte(goodSpans))
	f.Add([]byte("version: 1\nservices: [a]\nspans: [{name: x, parent: x}]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		set, err := ParseSpans(data)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		for _, trace := range set.Traces() {
			if _, ok := set.Root(trace); !ok {
				t.Fatalf("accepted trace %q without a root", trace)
			}
		}
		for _, sp := range set.Spans {
			if sp.Parent != "" {
				if _, ok := set.Lookup(sp.Parent); !ok {
					t.Fatalf("accepted missing parent %q", sp.Parent)
				}
			}
		}
	})
}

func FuzzParseSLOs(f *testing.F) {
	inst, err := Instruments()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(sloYAML)
	f.Add([]byte(goodSLO))
	f.Add([]byte("version: 1\nwindow: 1h\nobjectives: [{name: a, kind: latency, target: 0.5, threshold: 0.5}]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		set, err := ParseSLOs(data, inst)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		for _, o := range set.Objectives {
			in, ok := inst.Lookup(o.Metric)
			if !ok || (o.Kind == Latency && !in.HasBound(o.Threshold)) {
				t.Fatalf("accepted objective %+v", o)
			}
		}
	})
}
