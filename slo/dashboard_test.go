package slo_test

import (
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/cacheblend/cacheblend/contract"
	"github.com/cacheblend/cacheblend/slo"
)

const dashboardFile = "deploy/grafana/cacheblend.json"

type gridPos struct {
	H, W, X, Y int
}

type dsRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type target struct {
	RefID      string `json:"refId"`
	Expr       string `json:"expr"`
	Exemplar   bool   `json:"exemplar"`
	Datasource *dsRef `json:"datasource"`
}

type panel struct {
	ID         int            `json:"id"`
	Repeat     string         `json:"repeat"`
	Type       string         `json:"type"`
	Title      string         `json:"title"`
	GridPos    *gridPos       `json:"gridPos"`
	Datasource *dsRef         `json:"datasource"`
	Targets    []target       `json:"targets"`
	Panels     []panel        `json:"panels"`
	Options    map[string]any `json:"options"`
}

type dashboard struct {
	UID           string  `json:"uid"`
	Title         string  `json:"title"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query string `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Time struct {
		From string `json:"from"`
		To   string `json:"to"`
	} `json:"time"`
	Links []struct {
		URL string `json:"url"`
	} `json:"links"`
}

type panelTarget struct {
	panel  string
	target target
}

// all returns every panel, rows' nested panels included.
func (d *dashboard) all() []panel {
	var out []panel
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			out = append(out, p)
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

func (d *dashboard) targets() []panelTarget {
	var out []panelTarget
	for _, p := range d.all() {
		for _, tg := range p.Targets {
			out = append(out, panelTarget{panel: p.Title, target: tg})
		}
	}
	return out
}

func loadDashboard(t testing.TB) *dashboard {
	t.Helper()
	var d dashboard
	if err := json.Unmarshal(mustRead(t, repoPath(t, dashboardFile)), &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return &d
}

// The dashboard is a well-formed Grafana dashboard (schema 39, as Grafana 10.4/11 writes it):
// unique panel ids, panels inside the 24-column grid without overlaps, every query on the
// datasource variable with a unique refId.
func TestDashboardShape(t *testing.T) {
	d := loadDashboard(t)
	if d.UID == "" || d.Title == "" || d.SchemaVersion < 36 || d.Time.From == "" {
		t.Fatalf("dashboard header: uid %q title %q schemaVersion %d time %+v", d.UID, d.Title, d.SchemaVersion, d.Time)
	}
	if len(d.Templating.List) != 2 || d.Templating.List[0].Name != "datasource" || d.Templating.List[0].Type != "datasource" || d.Templating.List[0].Query != "prometheus" ||
		d.Templating.List[1].Name != "node" || d.Templating.List[1].Type != "query" || !strings.Contains(d.Templating.List[1].Query, "instance") {
		t.Fatalf("templating: want a Prometheus datasource variable named datasource and a node variable over the engines' instances, got %+v", d.Templating.List)
	}
	known := []string{"row", "timeseries", "stat", "table", "text"}
	ids := map[int]bool{}
	var boxes []gridPos
	for _, p := range d.all() {
		if ids[p.ID] || p.ID <= 0 {
			t.Errorf("panel %q: id %d missing or reused", p.Title, p.ID)
		}
		ids[p.ID] = true
		if !slices.Contains(known, p.Type) || p.Title == "" {
			t.Errorf("panel %d: type %q title %q", p.ID, p.Type, p.Title)
		}
		g := p.GridPos
		if g == nil || g.W <= 0 || g.H <= 0 || g.X < 0 || g.Y < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: gridPos %+v outside the 24-column grid", p.Title, g)
			continue
		}
		for _, b := range boxes {
			if g.X < b.X+b.W && b.X < g.X+g.W && g.Y < b.Y+b.H && b.Y < g.Y+g.H {
				t.Errorf("panel %q at %+v overlaps another at %+v", p.Title, *g, b)
			}
		}
		boxes = append(boxes, *g)
		switch p.Type {
		case "row":
			continue
		case "text":
			if c, _ := p.Options["content"].(string); c == "" {
				t.Errorf("text panel %q is empty", p.Title)
			}
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" || p.Datasource.Type != "prometheus" {
			t.Errorf("panel %q: datasource %+v, want the ${datasource} variable", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if tg.RefID == "" || refs[tg.RefID] || strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("panel %q: target %+v: refId missing or reused, or no expr", p.Title, tg)
			}
			refs[tg.RefID] = true
			if tg.Datasource == nil || tg.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q %s: datasource %+v", p.Title, tg.RefID, tg.Datasource)
			}
		}
	}
	if !slices.ContainsFunc(d.Links, func(l struct {
		URL string `json:"url"`
	}) bool {
		return strings.Contains(l.URL, ":16686")
	}) {
		t.Error("no dashboard link to the trace UI")
	}
}

var (
	stringRE   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	matchersRE = regexp.MustCompile(`\{[^}]*\}`)
	groupingRE = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	rangeRE    = regexp.MustCompile(`\[[^\]]*\]`)
	nameRE     = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
)

// metricNames returns the metric names an expression selects (label names, functions,
// keywords, strings and ranges stripped). Names are recognised by cacheblend's prefixes.
func metricNames(expr string) []string {
	s := stringRE.ReplaceAllString(expr, `""`)
	s = matchersRE.ReplaceAllString(s, " ")
	s = groupingRE.ReplaceAllString(s, " ")
	s = rangeRE.ReplaceAllString(s, " ")
	var out []string
	for _, n := range nameRE.FindAllString(s, -1) {
		for _, prefix := range []string{"gen_ai_", "http_", "cb_", "lmcache_", "slo:", "up", "ALERTS"} {
			if strings.HasPrefix(n, prefix) {
				out = append(out, n)
				break
			}
		}
	}
	return out
}

// Every metric the dashboard queries is a contract instrument (or one of its histogram
// series) or a series the generated rules record: a renamed metric breaks this test instead
// of silently emptying a panel. The panels the deployment promises are present, and the
// latency panels of exemplar-carrying histograms show exemplars.
func TestDashboardQueriesTheContract(t *testing.T) {
	set, inst := contractSets(t)
	file, err := slo.Build(set, inst)
	if err != nil {
		t.Fatal(err)
	}
	valid := map[string]bool{"up": true}
	for _, in := range inst.Instruments {
		valid[in.Name] = true
		if in.Type == contract.Histogram {
			for _, sfx := range []string{"_bucket", "_count", "_sum"} {
				valid[in.Name+sfx] = true
			}
		}
	}
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				valid[r.Record] = true
			}
		}
	}
	d := loadDashboard(t)
	used := map[string]bool{}
	for _, pt := range d.targets() {
		names := metricNames(pt.target.Expr)
		if len(names) == 0 {
			t.Errorf("panel %q %s: no metric found in %q", pt.panel, pt.target.RefID, pt.target.Expr)
		}
		for _, n := range names {
			used[n] = true
			if !valid[n] {
				t.Errorf("panel %q %s: %s is neither a contract instrument nor a recorded series", pt.panel, pt.target.RefID, n)
			}
		}
	}
	for _, want := range []string{
		"gen_ai_server_time_to_first_token_seconds_bucket", "gen_ai_server_time_per_output_token_seconds_bucket",
		"gen_ai_server_request_duration_seconds_bucket", "gen_ai_server_request_duration_seconds_count",
		"http_server_request_duration_seconds_count", "slo:error_budget:ratio",
		"slo:sli_error:ratio_rate5m", "slo:sli_error:ratio_rate1h", "slo:sli_error:ratio_rate6h",
		"cb_engine_kv_blocks", "lmcache_blend_lookup_hit_tokens_total", "lmcache_blend_lookup_requested_tokens_total",
		"lmcache_blend_l2_read_bytes_total", "lmcache_blend_l2_load_throughput_gbps_bucket",
		"lmcache_blend_event_bus_dropped_total", "cb_trace_spans_dropped_total",
	} {
		if !used[want] {
			t.Errorf("the dashboard does not query %s", want)
		}
	}
	// Panels quantiling an exemplar histogram request exemplars on at least one query.
	exemplarHist := map[string]bool{}
	for _, in := range inst.Instruments {
		if in.Exemplars {
			exemplarHist[in.Name+"_bucket"] = true
		}
	}
	exemplarPanels := 0
	for _, p := range d.all() {
		wants, has := false, false
		for _, tg := range p.Targets {
			for _, n := range metricNames(tg.Expr) {
				if exemplarHist[n] && strings.Contains(tg.Expr, "histogram_quantile") {
					wants = true
				}
			}
			has = has || tg.Exemplar
		}
		if wants && !has {
			t.Errorf("panel %q quantiles an exemplar histogram without exemplar: true", p.Title)
		}
		if has {
			exemplarPanels++
		}
	}
	if exemplarPanels < 4 {
		t.Errorf("%d exemplar panels, want TTFT, TPOT, duration, blend and worker latency", exemplarPanels)
	}
}

// The per-node row (cb up --nodes N) repeats by the node variable and holds the
// request rate, TTFT p95, hit rate and KV blocks of that node's engine, each
// query selecting instance=~"$node".
func TestDashboardPerNodeRow(t *testing.T) {
	d := loadDashboard(t)
	at := slices.IndexFunc(d.Panels, func(p panel) bool { return p.Type == "row" && p.Repeat == "node" })
	if at < 0 {
		t.Fatal("no row repeated by the node variable")
	}
	row := d.Panels[at]
	var inRow []panel
	for _, p := range d.Panels[at+1:] {
		if p.Type == "row" {
			break
		}
		inRow = append(inRow, p)
	}
	want := map[string]string{
		"Request rate": "gen_ai_server_request_duration_seconds_count",
		"TTFT p95":     "gen_ai_server_time_to_first_token_seconds_bucket",
		"Hit rate":     "cb_engine_prefix_cache_hit_ratio",
		"KV blocks":    "cb_engine_kv_blocks",
	}
	for title, metric := range want {
		i := slices.IndexFunc(inRow, func(p panel) bool { return strings.HasPrefix(p.Title, title) })
		if i < 0 {
			t.Errorf("row %q: no %s panel", row.Title, title)
			continue
		}
		p := inRow[i]
		found := false
		for _, tg := range p.Targets {
			if !strings.Contains(tg.Expr, `instance=~"$node"`) {
				t.Errorf("panel %q %s: %q does not select instance=~\"$node\"", p.Title, tg.RefID, tg.Expr)
			}
			found = found || slices.Contains(metricNames(tg.Expr), metric)
		}
		if !found {
			t.Errorf("panel %q does not query %s", p.Title, metric)
		}
		if p.GridPos == nil || p.GridPos.Y != row.GridPos.Y+1 {
			t.Errorf("panel %q at %+v, want on the row's first line", p.Title, p.GridPos)
		}
	}
}

func TestMetricNames(t *testing.T) {
	tests := []struct {
		expr string
		want []string
	}{
		{`histogram_quantile(0.95, sum by (le, gen_ai_operation_name) (rate(gen_ai_server_request_duration_seconds_bucket{error_type=""}[$__rate_interval])))`,
			[]string{"gen_ai_server_request_duration_seconds_bucket"}},
		{`slo:sli_error:ratio_rate1h / on(slo) slo:error_budget:ratio`, []string{"slo:sli_error:ratio_rate1h", "slo:error_budget:ratio"}},
		{`sum by (leg) (rate(lmcache_blend_lookup_hit_tokens_total[1m])) / ignoring(leg) group_left() sum(rate(lmcache_blend_lookup_requested_tokens_total[1m]))`,
			[]string{"lmcache_blend_lookup_hit_tokens_total", "lmcache_blend_lookup_requested_tokens_total"}},
		{`up{job=~"cb-.*", http_route="gen_ai_x"}`, []string{"up"}},
	}
	for _, tt := range tests {
		if got := metricNames(tt.expr); !slices.Equal(got, tt.want) {
			t.Errorf("metricNames(%q) = %v, want %v", tt.expr, got, tt.want)
		}
	}
}

// The Grafana provisioning files parse, the data source turns the exemplars' trace_id into a
// link to the trace page (with $$ so Grafana does not expand it as an environment variable),
// and the dashboard provider exists.
func TestGrafanaProvisioning(t *testing.T) {
	var ds struct {
		APIVersion  int `yaml:"apiVersion"`
		Datasources []struct {
			Name     string `yaml:"name"`
			UID      string `yaml:"uid"`
			Type     string `yaml:"type"`
			URL      string `yaml:"url"`
			JSONData struct {
				Exemplars []struct {
					Name          string `yaml:"name"`
					URL           string `yaml:"url"`
					DatasourceUID string `yaml:"datasourceUid"`
				} `yaml:"exemplarTraceIdDestinations"`
			} `yaml:"jsonData"`
		} `yaml:"datasources"`
	}
	if err := yaml.Unmarshal(mustRead(t, repoPath(t, "deploy/grafana/provisioning/datasources/cacheblend.yaml")), &ds); err != nil {
		t.Fatal(err)
	}
	if ds.APIVersion != 1 || len(ds.Datasources) == 0 || ds.Datasources[0].Type != "prometheus" || ds.Datasources[0].URL == "" {
		t.Fatalf("datasource provisioning: %+v", ds)
	}
	ex := ds.Datasources[0].JSONData.Exemplars
	if len(ex) == 0 || ex[0].Name != "trace_id" || !strings.HasSuffix(ex[0].URL, "/#/trace/$${__value.raw}") {
		t.Fatalf("exemplar destinations %+v: want trace_id → http://…:16686/#/trace/$${__value.raw}", ex)
	}
	// The exemplar label the link reads is the one package metrics attaches.
	if src := string(mustRead(t, repoPath(t, "metrics/instruments.go"))); !strings.Contains(src, `"trace_id"`) {
		t.Fatal("package metrics no longer labels exemplars trace_id")
	}
	var dp struct {
		APIVersion int `yaml:"apiVersion"`
		Providers  []struct {
			Type    string `yaml:"type"`
			Options struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	if err := yaml.Unmarshal(mustRead(t, repoPath(t, "deploy/grafana/provisioning/dashboards/cacheblend.yaml")), &dp); err != nil {
		t.Fatal(err)
	}
	if dp.APIVersion != 1 || len(dp.Providers) != 1 || dp.Providers[0].Type != "file" || dp.Providers[0].Options.Path == "" {
		t.Fatalf("dashboard provisioning: %+v", dp)
	}
}

// The example OpenTelemetry Collector configuration wires an OTLP receiver to an OTLP exporter
// in a traces pipeline, and every component it names is defined.
func TestCollectorConfig(t *testing.T) {
	var cfg struct {
		Receivers  map[string]any `yaml:"receivers"`
		Processors map[string]any `yaml:"processors"`
		Exporters  map[string]any `yaml:"exporters"`
		Extensions map[string]any `yaml:"extensions"`
		Service    struct {
			Extensions []string `yaml:"extensions"`
			Pipelines  map[string]struct {
				Receivers  []string `yaml:"receivers"`
				Processors []string `yaml:"processors"`
				Exporters  []string `yaml:"exporters"`
			} `yaml:"pipelines"`
		} `yaml:"service"`
	}
	if err := yaml.Unmarshal(mustRead(t, repoPath(t, "deploy/otel-collector/config.yaml")), &cfg); err != nil {
		t.Fatal(err)
	}
	p, ok := cfg.Service.Pipelines["traces"]
	if !ok || !slices.Contains(p.Receivers, "otlp") || len(p.Exporters) == 0 || !strings.HasPrefix(p.Exporters[0], "otlp") {
		t.Fatalf("traces pipeline %+v: want otlp receiver → otlp exporter", p)
	}
	check := func(kind string, names []string, defined map[string]any) {
		for _, n := range names {
			if _, ok := defined[n]; !ok {
				t.Errorf("%s %q used in a pipeline but not defined", kind, n)
			}
		}
	}
	check("receiver", p.Receivers, cfg.Receivers)
	check("processor", p.Processors, cfg.Processors)
	check("exporter", p.Exporters, cfg.Exporters)
	check("extension", cfg.Service.Extensions, cfg.Extensions)
}
