package slo_test

import (
	"bytes"
	"errors"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"gopkg.in/yaml.v3"

	"github.com/cacheblend/cacheblend/contract"
	"github.com/cacheblend/cacheblend/slo"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const rulesFile = "deploy/prometheus/slo-rules.yml"

func mustRead(t testing.TB, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func contractSets(t testing.TB) (*contract.SLOSet, *contract.InstrumentSet) {
	t.Helper()
	set, err := contract.SLOs()
	if err != nil {
		t.Fatal(err)
	}
	inst, err := contract.Instruments()
	if err != nil {
		t.Fatal(err)
	}
	return set, inst
}

func generate(t testing.TB) []byte {
	t.Helper()
	set, inst := contractSets(t)
	data, err := slo.Generate(set, inst)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// The committed rule file is exactly the generator's output for the embedded contract.
func TestCommittedRulesAreGenerated(t *testing.T) {
	want := generate(t)
	got := mustRead(t, repoPath(t, rulesFile))
	if !bytes.Equal(got, want) {
		gl, wl := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
		line := 0
		for line < len(gl) && line < len(wl) && gl[line] == wl[line] {
			line++
		}
		g, w := "<EOF>", "<EOF>"
		if line < len(gl) {
			g = gl[line]
		}
		if line < len(wl) {
			w = wl[line]
		}
		t.Fatalf("%s is stale (first difference at line %d:\n  committed: %q\n  generated: %q)\nregenerate it: go run ./cmd/cb slo-rules --out %s",
			rulesFile, line+1, g, w, rulesFile)
	}
}

func TestGenerateIsDeterministic(t *testing.T) {
	first := generate(t)
	for range 5 {
		if next := generate(t); !bytes.Equal(first, next) {
			t.Fatal("two generations differ")
		}
	}
	if !bytes.HasPrefix(first, []byte(slo.Header)) {
		t.Fatal("the output does not start with the header")
	}
}

// The generated file parses back into the rule model Build returns.
func TestGenerateRoundTrip(t *testing.T) {
	set, inst := contractSets(t)
	want, err := slo.Build(set, inst)
	if err != nil {
		t.Fatal(err)
	}
	var got slo.RuleFile
	if err := yaml.Unmarshal(generate(t), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Groups) != len(want.Groups) {
		t.Fatalf("%d groups, want %d", len(got.Groups), len(want.Groups))
	}
	for i := range want.Groups {
		g, w := got.Groups[i], want.Groups[i]
		if g.Name != w.Name || len(g.Rules) != len(w.Rules) {
			t.Fatalf("group %d: %s with %d rules, want %s with %d", i, g.Name, len(g.Rules), w.Name, len(w.Rules))
		}
		for j := range w.Rules {
			if g.Rules[j].Expr != w.Rules[j].Expr || g.Rules[j].Record != w.Rules[j].Record || g.Rules[j].Alert != w.Rules[j].Alert {
				t.Errorf("%s rule %d differs after a round trip:\n%+v\n%+v", w.Name, j, g.Rules[j], w.Rules[j])
			}
		}
	}
}

// The structure the contract asks for: per objective, the budget, one error ratio per window
// (5m … 3d, shortest first) and one alert per severity, with the right thresholds.
func TestBuildStructure(t *testing.T) {
	set, inst := contractSets(t)
	file, err := slo.Build(set, inst)
	if err != nil {
		t.Fatal(err)
	}
	wantWindows := []string{"5m", "30m", "1h", "2h", "6h", "1d", "3d"}
	if len(file.Groups) != len(set.Objectives) {
		t.Fatalf("%d groups for %d objectives", len(file.Groups), len(set.Objectives))
	}
	for i, g := range file.Groups {
		o := set.Objectives[i]
		if g.Name != "cacheblend-slo-"+o.Name {
			t.Errorf("group %q for objective %s", g.Name, o.Name)
		}
		var records, alerts []string
		for _, r := range g.Rules {
			if r.Labels[slo.LabelSLO] != o.Name {
				t.Errorf("%s: rule %s%s has slo=%q", g.Name, r.Record, r.Alert, r.Labels[slo.LabelSLO])
			}
			if r.Record != "" {
				records = append(records, r.Record)
			} else {
				alerts = append(alerts, r.Alert)
			}
		}
		want := []string{"slo:error_budget:ratio"}
		for _, w := range wantWindows {
			want = append(want, "slo:sli_error:ratio_rate"+w)
		}
		if !slices.Equal(records, want) {
			t.Errorf("%s: records %v, want %v", g.Name, records, want)
		}
		if !slices.Equal(alerts, []string{"CacheblendSLOBurnRatePage", "CacheblendSLOBurnRateTicket"}) {
			t.Errorf("%s: alerts %v", g.Name, alerts)
		}
		budget := strconv.FormatFloat(math.Round((1-o.Target)*1e9)/1e9, 'g', -1, 64)
		if g.Rules[0].Expr != "vector("+budget+")" {
			t.Errorf("%s: budget rule %q, want vector(%s)", g.Name, g.Rules[0].Expr, budget)
		}
	}
	// The exact alert conditions of the contract, for the TTFT (budget 0.05) and availability
	// (budget 0.005) objectives.
	wantConds := map[string]map[string][]string{
		"ttft": {
			"page":   {`slo:sli_error:ratio_rate1h{slo="ttft"} > 0.72`, `slo:sli_error:ratio_rate5m{slo="ttft"} > 0.72`, `slo:sli_error:ratio_rate6h{slo="ttft"} > 0.3`, `slo:sli_error:ratio_rate30m{slo="ttft"} > 0.3`},
			"ticket": {`slo:sli_error:ratio_rate1d{slo="ttft"} > 0.15`, `slo:sli_error:ratio_rate2h{slo="ttft"} > 0.15`, `slo:sli_error:ratio_rate3d{slo="ttft"} > 0.05`, `slo:sli_error:ratio_rate6h{slo="ttft"} > 0.05`},
		},
		"availability": {
			"page":   {`slo:sli_error:ratio_rate1h{slo="availability"} > 0.072`, `slo:sli_error:ratio_rate5m{slo="availability"} > 0.072`, `slo:sli_error:ratio_rate6h{slo="availability"} > 0.03`, `slo:sli_error:ratio_rate30m{slo="availability"} > 0.03`},
			"ticket": {`slo:sli_error:ratio_rate1d{slo="availability"} > 0.015`, `slo:sli_error:ratio_rate2h{slo="availability"} > 0.015`, `slo:sli_error:ratio_rate3d{slo="availability"} > 0.005`, `slo:sli_error:ratio_rate6h{slo="availability"} > 0.005`},
		},
	}
	condRE := regexp.MustCompile(`slo:sli_error:ratio_rate\w+\{slo="\w+"\} > [0-9.e-]+`)
	for _, g := range file.Groups {
		obj := strings.TrimPrefix(g.Name, "cacheblend-slo-")
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			sev := r.Labels[slo.LabelSeverity]
			want, ok := wantConds[obj][sev]
			if !ok {
				continue
			}
			if got := condRE.FindAllString(r.Expr, -1); !slices.Equal(got, want) {
				t.Errorf("%s %s: conditions %q, want %q", obj, sev, got, want)
			}
			if strings.Count(r.Expr, "\nor\n") != 1 || strings.Count(r.Expr, "\nand\n") != 2 {
				t.Errorf("%s %s: want (long and short) or (long and short):\n%s", obj, sev, r.Expr)
			}
			for _, k := range []string{"summary", "description", "runbook", "runbook_url"} {
				if r.Annotations[k] == "" {
					t.Errorf("%s %s: no %s annotation", obj, sev, k)
				}
			}
		}
	}
}

// Every le matcher of every generated expression selects an existing bucket bound of the
// histogram it is applied to (the contract guarantees it; this checks the generator).
func TestThresholdsAreBucketBounds(t *testing.T) {
	set, inst := contractSets(t)
	file, err := slo.Build(set, inst)
	if err != nil {
		t.Fatal(err)
	}
	bucketRE := regexp.MustCompile(`([a-z_:][a-z0-9_:]*)_bucket\{[^}]*\ble(=~?)"((?:[^"\\]|\\.)*)"`)
	seen := 0
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			for _, m := range bucketRE.FindAllStringSubmatch(r.Expr, -1) {
				seen++
				in, ok := inst.Lookup(m[1])
				if !ok || in.Type != contract.Histogram {
					t.Errorf("%s: %s is not a histogram of the contract", r.Record, m[1])
					continue
				}
				val, err := strconv.Unquote(`"` + m[3] + `"`)
				if err != nil {
					t.Fatalf("%s: le value %q: %v", r.Record, m[3], err)
				}
				alts := []string{val}
				if m[2] == "=~" {
					alts = strings.Split(strings.ReplaceAll(val, `\.`, "."), "|")
				}
				for _, a := range alts {
					b, err := strconv.ParseFloat(a, 64)
					if err != nil || !in.HasBound(b) {
						t.Errorf("%s: le %q is not a bucket bound of %s %v", r.Record, a, m[1], in.Buckets)
					}
				}
			}
		}
	}
	latency := 0
	for _, o := range set.Objectives {
		if o.Kind == contract.Latency {
			latency++
		}
	}
	if want := latency * len(slo.Windows(set)); seen != want {
		t.Fatalf("found %d bucket selectors, want %d (one per latency objective and window)", seen, want)
	}
}

func TestWindows(t *testing.T) {
	tests := []struct {
		name   string
		alerts []contract.BurnRateAlert
		want   []time.Duration
	}{
		{"contract", nil, []time.Duration{5 * time.Minute, 30 * time.Minute, time.Hour, 2 * time.Hour, 6 * time.Hour, 24 * time.Hour, 72 * time.Hour}},
		{"shared windows are listed once", []contract.BurnRateAlert{
			{LongWindow: time.Hour, ShortWindow: 5 * time.Minute},
			{LongWindow: 6 * time.Hour, ShortWindow: time.Hour},
			{LongWindow: time.Hour, ShortWindow: 5 * time.Minute},
		}, []time.Duration{5 * time.Minute, time.Hour, 6 * time.Hour}},
		{"none", []contract.BurnRateAlert{}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			set, _ := contractSets(t)
			if tt.alerts != nil {
				set.BurnRateAlerts = tt.alerts
			}
			if got := slo.Windows(set); !slices.Equal(got, tt.want) {
				t.Fatalf("Windows = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestErrorRatioRecord(t *testing.T) {
	tests := []struct {
		w    time.Duration
		want string
	}{
		{5 * time.Minute, "slo:sli_error:ratio_rate5m"},
		{30 * time.Minute, "slo:sli_error:ratio_rate30m"},
		{time.Hour, "slo:sli_error:ratio_rate1h"},
		{90 * time.Minute, "slo:sli_error:ratio_rate1h30m"},
		{24 * time.Hour, "slo:sli_error:ratio_rate1d"},
		{72 * time.Hour, "slo:sli_error:ratio_rate3d"},
		{30 * time.Second, "slo:sli_error:ratio_rate30s"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			if got := slo.ErrorRatioRecord(tt.w); got != tt.want {
				t.Fatalf("ErrorRatioRecord(%v) = %q, want %q", tt.w, got, tt.want)
			}
		})
	}
}

func TestBurnThreshold(t *testing.T) {
	tests := []struct {
		name           string
		factor, target float64
		want           float64
	}{
		{"ttft page fast", 14.4, 0.95, 0.72},
		{"ttft page slow", 6, 0.95, 0.3},
		{"ttft ticket fast", 3, 0.95, 0.15},
		{"ttft ticket slow", 1, 0.95, 0.05},
		{"availability page fast", 14.4, 0.995, 0.072},
		{"availability page slow", 6, 0.995, 0.03},
		{"availability ticket fast", 3, 0.995, 0.015},
		{"availability ticket slow", 1, 0.995, 0.005},
		{"three nines", 14.4, 0.999, 0.0144},
		{"whole budget", 20, 0.95, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := slo.BurnThreshold(tt.factor, tt.target); got != tt.want {
				t.Fatalf("BurnThreshold(%v, %v) = %v, want %v", tt.factor, tt.target, got, tt.want)
			}
		})
	}
}

func TestExhaustionTime(t *testing.T) {
	tests := []struct {
		factor float64
		want   time.Duration
	}{
		{14.4, 50 * time.Hour},
		{6, 5 * 24 * time.Hour},
		{3, 10 * 24 * time.Hour},
		{1, 30 * 24 * time.Hour},
	}
	for _, tt := range tests {
		t.Run(strconv.FormatFloat(tt.factor, 'g', -1, 64), func(t *testing.T) {
			if got := slo.ExhaustionTime(30*24*time.Hour, tt.factor); got != tt.want {
				t.Fatalf("ExhaustionTime(30d, %v) = %v, want %v", tt.factor, got, tt.want)
			}
		})
	}
}

func TestAlertName(t *testing.T) {
	for sev, want := range map[string]string{
		"page":        "CacheblendSLOBurnRatePage",
		"ticket":      "CacheblendSLOBurnRateTicket",
		"low_urgency": "CacheblendSLOBurnRateLowUrgency",
	} {
		if got := slo.AlertName(sev); got != want {
			t.Errorf("AlertName(%q) = %q, want %q", sev, got, want)
		}
	}
}

func TestLeMatcher(t *testing.T) {
	tests := []struct {
		bound float64
		want  string
	}{
		{0.5, `le="0.5"`},
		{0.06, `le="0.06"`},
		{0.0001, `le="0.0001"`},
		{1e-05, `le="1e-05"`},
		{1, `le=~"1|1\\.0"`},
		{10, `le=~"10|10\\.0"`},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			if got := slo.LeMatcher(tt.bound); got != tt.want {
				t.Fatalf("LeMatcher(%v) = %s, want %s", tt.bound, got, tt.want)
			}
		})
	}
}

func TestErrorRatioExpr(t *testing.T) {
	set, inst := contractSets(t)
	tests := []struct {
		objective contract.Objective
		want      string
	}{
		{contract.Objective{Name: "ttft", Kind: contract.Latency, Metric: "gen_ai_server_time_to_first_token_seconds", Threshold: 0.5, Target: 0.95},
			"1 - (\n  sum(rate(gen_ai_server_time_to_first_token_seconds_bucket{le=\"0.5\"}[1h]))\n/\n  sum(rate(gen_ai_server_time_to_first_token_seconds_count[1h]))\n)"},
		{contract.Objective{Name: "chat_ttft", Kind: contract.Latency, Metric: "gen_ai_server_time_to_first_token_seconds", Threshold: 1, Target: 0.99,
			Selector: []contract.Matcher{{Label: "gen_ai_operation_name", Op: "=", Value: "chat"}}},
			"1 - (\n  sum(rate(gen_ai_server_time_to_first_token_seconds_bucket{gen_ai_operation_name=\"chat\",le=~\"1|1\\\\.0\"}[1h]))\n/\n  sum(rate(gen_ai_server_time_to_first_token_seconds_count{gen_ai_operation_name=\"chat\"}[1h]))\n)"},
		{*must(set.Lookup("availability")),
			"sum(rate(http_server_request_duration_seconds_count{http_route=~\"/v1/.+\",http_response_status_code=~\"5..\"}[1h]))\n/\nsum(rate(http_server_request_duration_seconds_count{http_route=~\"/v1/.+\"}[1h]))"},
	}
	for _, tt := range tests {
		t.Run(tt.objective.Name, func(t *testing.T) {
			got, err := slo.ErrorRatioExpr(&tt.objective, inst, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Fatalf("got\n%s\nwant\n%s", got, tt.want)
			}
		})
	}
}

func must[T any](v T, ok bool) T {
	if !ok {
		panic("lookup failed")
	}
	return v
}

func TestBuildRefusesBadInput(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*contract.SLOSet, **contract.InstrumentSet)
	}{
		{"nil instruments", func(_ *contract.SLOSet, inst **contract.InstrumentSet) { *inst = nil }},
		{"no alerts", func(s *contract.SLOSet, _ **contract.InstrumentSet) { s.BurnRateAlerts = nil }},
		{"threshold not a bound", func(s *contract.SLOSet, _ **contract.InstrumentSet) { s.Objectives[0].Threshold = 0.45 }},
		{"unknown metric", func(s *contract.SLOSet, _ **contract.InstrumentSet) { s.Objectives[0].Metric = "nope_seconds" }},
		{"not a histogram", func(s *contract.SLOSet, _ **contract.InstrumentSet) {
			s.Objectives[0].Metric = "cb_engine_requests_waiting"
		}},
		{"availability without bad", func(s *contract.SLOSet, _ **contract.InstrumentSet) { s.Objectives[2].Bad = nil }},
		{"unknown kind", func(s *contract.SLOSet, _ **contract.InstrumentSet) { s.Objectives[1].Kind = "throughput" }},
		{"target 1", func(s *contract.SLOSet, _ **contract.InstrumentSet) { s.Objectives[1].Target = 1 }},
		{"zero window", func(s *contract.SLOSet, _ **contract.InstrumentSet) { s.BurnRateAlerts[0].ShortWindow = 0 }},
		{"infinite factor", func(s *contract.SLOSet, _ **contract.InstrumentSet) { s.BurnRateAlerts[0].Factor = math.Inf(1) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			set, inst := contractSets(t)
			tt.mutate(set, &inst)
			if _, err := slo.Generate(set, inst); !errors.Is(err, slo.ErrInvalid) {
				t.Fatalf("Generate: %v, want ErrInvalid", err)
			}
		})
	}
	if _, err := slo.Generate(nil, nil); !errors.Is(err, slo.ErrInvalid) {
		t.Fatalf("Generate(nil, nil): %v, want ErrInvalid", err)
	}
}

// Any SLO file the contract accepts generates rules that parse back, with one group per
// objective, without panicking.
func FuzzGenerate(f *testing.F) {
	f.Add(contract.SLOYAML())
	f.Add([]byte("version: 1\nwindow: 7d\nobjectives:\n  - {name: a, description: d, kind: latency, metric: gen_ai_server_time_per_output_token_seconds, threshold: 0.1, target: 0.9}\nburn_rate_alerts:\n  - {severity: low_urgency, long_window: 90m, short_window: 1m, factor: 2}\n"))
	inst, err := contract.Instruments()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		set, err := contract.ParseSLOs(data, inst)
		if err != nil {
			return
		}
		out, err := slo.Generate(set, inst)
		if err != nil {
			if len(set.BurnRateAlerts) == 0 && errors.Is(err, slo.ErrInvalid) {
				return
			}
			t.Fatalf("Generate of a valid contract: %v", err)
		}
		var file slo.RuleFile
		if err := yaml.Unmarshal(out, &file); err != nil {
			t.Fatalf("output does not parse: %v\n%s", err, out)
		}
		if len(file.Groups) != len(set.Objectives) {
			t.Fatalf("%d groups for %d objectives", len(file.Groups), len(set.Objectives))
		}
	})
}

func BenchmarkGenerate(b *testing.B) {
	set, inst := contractSets(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := slo.Generate(set, inst); err != nil {
			b.Fatal(err)
		}
	}
}
