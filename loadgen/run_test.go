package loadgen

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

var traceparentRE = regexp.MustCompile(`^00-([0-9a-f]{32})-([0-9a-f]{16})-01$`)

// quick returns a config against e with small, fast settings.
func quick(e *testEngine) Config {
	return Config{API: e.URL(), MaxTokens: 4, HealthWait: 5 * time.Second, SettleTimeout: 5 * time.Second}
}

func run(t *testing.T, cfg Config) *Report {
	t.Helper()
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return rep
}

func TestRunCrossCheckAgainstRealMetrics(t *testing.T) {
	// TTFTs of 110–190 ms on the server: the server p95 falls in the (0.1, 0.25] bucket.
	e := newTestEngine(t, func(e *testEngine) {
		e.ttft = func(i int) time.Duration { return 110*time.Millisecond + time.Duration(i*7%80)*time.Millisecond }
		e.itl = time.Millisecond
	})
	cfg := quick(e)
	cfg.Requests, cfg.Concurrency, cfg.MaxTokens, cfg.MaxPrefix, cfg.Seed = 40, 4, 8, 50, 7
	rep := run(t, cfg)

	if rep.Sent != 40 || rep.Succeeded != 40 || rep.Failed != 0 || rep.StoppedBy != StoppedByRequests {
		t.Fatalf("sent %d ok %d failed %d stopped by %s; errors %v", rep.Sent, rep.Succeeded, rep.Failed, rep.StoppedBy, rep.Errors)
	}
	if err := rep.Err(); err != nil {
		t.Fatalf("Err: %v", err)
	}
	s := rep.Server
	if s == nil || s.Error != "" {
		t.Fatalf("server check: %+v", s)
	}
	if s.RequestsCounted != 40 || !s.CountMatches || s.ServerErrors != 0 {
		t.Errorf("server counted %d (errors %d), matches %v", s.RequestsCounted, s.ServerErrors, s.CountMatches)
	}
	if s.TTFT.Count != 40 || s.TPOT.Count != 40 || s.E2E.Count != 40 {
		t.Errorf("server observations: ttft %d tpot %d e2e %d, want 40 each", s.TTFT.Count, s.TPOT.Count, s.E2E.Count)
	}
	if s.ServerP95Bucket != "(0.1, 0.25]" {
		t.Errorf("server p95 %v in bucket %s, want (0.1, 0.25]", s.ServerP95, s.ServerP95Bucket)
	}
	if !s.P95WithinOneBucket {
		t.Errorf("client p95 %v (%s) not within %s of server p95 %v", s.ClientP95, s.ClientP95Bucket, s.P95Window, s.ServerP95)
	}
	if s.P95Window != "(0.08, 0.5]" {
		t.Errorf("window %s", s.P95Window)
	}
	// The client's TTFT includes the server's: its p50 is at least the server's smallest delay.
	if float64(rep.TTFT.P50) < 0.11 || rep.TTFT.N != 40 || rep.TPOT.N != 40 {
		t.Errorf("client TTFT %+v TPOT %+v", rep.TTFT, rep.TPOT)
	}
	if m := e.maxInflight.Load(); m > 4 {
		t.Errorf("max in flight %d > concurrency 4", m)
	}

	// Every request carried its own traceparent whose trace id the report holds.
	seen := e.seen()
	if len(seen) != 40 {
		t.Fatalf("server saw %d requests", len(seen))
	}
	byTrace := map[string]seenRequest{}
	for _, q := range seen {
		m := traceparentRE.FindStringSubmatch(q.traceparent)
		if m == nil {
			t.Fatalf("bad traceparent %q", q.traceparent)
		}
		if _, dup := byTrace[m[1]]; dup {
			t.Fatalf("trace id %s reused", m[1])
		}
		byTrace[m[1]] = q
		b := q.body
		if !b.Stream || !b.StreamOptions.IncludeUsage || !b.IgnoreEOS || b.MaxTokens != 8 || b.Model != DefaultModel || b.Cacheblend != nil {
			t.Fatalf("request body %+v", b)
		}
	}
	corpus := map[string]string{}
	for _, d := range cfgDocs(cfg) {
		corpus[d.ID] = d.Text
	}
	for i, r := range rep.Requests {
		if r.Index != i || !r.OK() || r.Status != 200 || !r.Usage || r.OutputTokens != 8 {
			t.Fatalf("request %d: %+v", i, r)
		}
		q, ok := byTrace[r.TraceID]
		if !ok {
			t.Fatalf("request %d: trace id %s not seen by the server", i, r.TraceID)
		}
		content := q.body.Messages[0].Content
		if len(r.Documents) != DefaultDocsPerRequest || r.Prefix < 0 || r.Prefix > 50 {
			t.Fatalf("request %d: documents %v prefix %d", i, r.Documents, r.Prefix)
		}
		for j, id := range r.Documents {
			if !strings.HasPrefix(content[r.DocOffsets[j]:], corpus[id]) {
				t.Fatalf("request %d: document %s not at offset %d", i, id, r.DocOffsets[j])
			}
		}
		want := (float64(r.E2E) - float64(r.TTFT)) / 7
		if math.Abs(float64(r.TPOT)-want) > 1e-9 || r.TPOT <= 0 || r.TTFT > r.E2E {
			t.Fatalf("request %d: ttft %v tpot %v e2e %v", i, r.TTFT, r.TPOT, r.E2E)
		}
	}

	// The JSON report round-trips.
	path := filepath.Join(t.TempDir(), "load.json")
	if err := rep.WriteJSON(path); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatalf("report JSON: %v", err)
	}
	if back.Sent != 40 || back.Server == nil || back.Server.RequestsCounted != 40 || len(back.Requests) != 40 ||
		back.Server.TTFT.P95 != s.TTFT.P95 || len(back.Server.TTFT.Buckets) != len(s.TTFT.Buckets) {
		t.Errorf("round trip lost data: %+v", back.Server)
	}
	var out strings.Builder
	rep.Print(&out)
	for _, want := range []string{"TTFT client", "TTFT server", "TPOT server", "counted 40 (0 with error_type), sent 40: OK", "(0.1, 0.25]", ": yes"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("Print output lacks %q:\n%s", want, out.String())
		}
	}
}

func cfgDocs(cfg Config) []Document {
	c, _ := cfg.withDefaults()
	return c.Documents
}

func TestRunBoundedByDuration(t *testing.T) {
	e := newTestEngine(t, func(e *testEngine) { e.ttft = func(int) time.Duration { return 20 * time.Millisecond } })
	cfg := quick(e)
	cfg.Requests, cfg.Duration, cfg.Concurrency = 1_000_000, time.Second, 2
	start := time.Now()
	rep := run(t, cfg)
	if el := time.Since(start); el > 30*time.Second {
		t.Fatalf("a 1 s run took %v", el)
	}
	if rep.StoppedBy != StoppedByDuration || rep.Sent == 0 || rep.Sent >= cfg.Requests || rep.Failed != 0 {
		t.Fatalf("stopped by %s after %d sent (%d failed)", rep.StoppedBy, rep.Sent, rep.Failed)
	}
	if s := rep.Server; s == nil || !s.CountMatches || s.RequestsCounted != rep.Sent {
		t.Fatalf("server check %+v, sent %d", s, rep.Sent)
	}
	if got := int(e.arrivals.Load()); got != rep.Sent {
		t.Errorf("server saw %d, report says %d sent", got, rep.Sent)
	}
}

func TestRunGraceCancelsStragglers(t *testing.T) {
	e := newTestEngine(t, func(e *testEngine) { e.ttft = func(int) time.Duration { return time.Minute } })
	cfg := quick(e)
	cfg.Requests, cfg.Concurrency, cfg.Duration, cfg.Grace = 2, 2, 200*time.Millisecond, 200*time.Millisecond
	rep := run(t, cfg)
	if rep.Sent != 2 || rep.Failed != 2 || rep.Errors[KindCanceled] != 2 {
		t.Fatalf("sent %d failed %d errors %v", rep.Sent, rep.Failed, rep.Errors)
	}
	if !errors.Is(rep.Err(), ErrRequestsFailed) {
		t.Errorf("Err = %v", rep.Err())
	}
	// The server recorded both (error_type canceled) once it saw the disconnect.
	if s := rep.Server; s == nil || s.RequestsCounted != 2 || s.ServerErrors != 2 {
		t.Errorf("server check %+v", s)
	}
}

func TestRunRequestTimeout(t *testing.T) {
	e := newTestEngine(t, func(e *testEngine) { e.ttft = func(int) time.Duration { return time.Minute } })
	cfg := quick(e)
	cfg.Requests, cfg.Concurrency, cfg.RequestTimeout = 2, 2, 200*time.Millisecond
	rep := run(t, cfg)
	if rep.Sent != 2 || rep.Failed != 2 || rep.Errors[KindTimeout] != 2 {
		t.Fatalf("sent %d failed %d errors %v", rep.Sent, rep.Failed, rep.Errors)
	}
	for _, r := range rep.Requests {
		if r.Status != 200 || !strings.HasPrefix(r.Error, "timeout: ") || !math.IsNaN(float64(r.TTFT)) {
			t.Errorf("timed-out request %+v", r)
		}
	}
}

func TestRunCountsErrors(t *testing.T) {
	e := newTestEngine(t, func(e *testEngine) { e.fail = func(i int) bool { return i%4 == 3 } })
	cfg := quick(e)
	cfg.Requests, cfg.Concurrency = 20, 4
	rep := run(t, cfg)
	if rep.Sent != 20 || rep.Failed != 5 || rep.Succeeded != 15 || rep.Errors["http_503"] != 5 {
		t.Fatalf("sent %d ok %d failed %d errors %v", rep.Sent, rep.Succeeded, rep.Failed, rep.Errors)
	}
	for _, r := range rep.Requests {
		if !r.OK() && (r.Status != 503 || !strings.Contains(r.Error, "The queue is full.") || !math.IsNaN(float64(r.TTFT))) {
			t.Errorf("failed request %+v", r)
		}
	}
	err := rep.Err()
	if !errors.Is(err, ErrRequestsFailed) || errors.Is(err, ErrCountMismatch) {
		t.Errorf("Err = %v", err)
	}
	s := rep.Server
	if s == nil || s.RequestsCounted != 20 || !s.CountMatches || s.ServerErrors != 5 || s.TTFT.Count != 15 || s.E2E.Count != 15 {
		t.Errorf("server check %+v", s)
	}
	if rep.TTFT.N != 15 {
		t.Errorf("client TTFT over %d requests, want the 15 successes", rep.TTFT.N)
	}
}

func TestRunDetectsCountMismatch(t *testing.T) {
	e := newTestEngine(t, func(e *testEngine) { e.unrecorded = func(i int) bool { return i%5 == 0 } })
	cfg := quick(e)
	cfg.Requests, cfg.Concurrency, cfg.SettleTimeout = 10, 2, 300*time.Millisecond
	rep := run(t, cfg)
	s := rep.Server
	if s == nil || s.CountMatches || s.RequestsCounted != 8 || s.RequestsSent != 10 || float64(s.SettleWait) < 0.3 {
		t.Fatalf("server check %+v", s)
	}
	err := rep.Err()
	if !errors.Is(err, ErrCountMismatch) || errors.Is(err, ErrRequestsFailed) {
		t.Errorf("Err = %v", err)
	}
	var out strings.Builder
	rep.Print(&out)
	if !strings.Contains(out.String(), "counted 8 (0 with error_type), sent 10: MISMATCH") {
		t.Errorf("Print:\n%s", out.String())
	}
}

func TestRunOpenLoopRate(t *testing.T) {
	e := newTestEngine(t, func(e *testEngine) { e.ttft = func(int) time.Duration { return 5 * time.Millisecond } })
	cfg := quick(e)
	cfg.Requests, cfg.Concurrency, cfg.Rate = 10, 4, 25
	start := time.Now()
	rep := run(t, cfg)
	if rep.Sent != 10 || rep.Failed != 0 || rep.Mode != "open loop" || rep.StoppedBy != StoppedByRequests {
		t.Fatalf("sent %d failed %d mode %s stopped by %s", rep.Sent, rep.Failed, rep.Mode, rep.StoppedBy)
	}
	// Arrivals are evenly spaced at 1/rate and no request starts before its arrival.
	for i, r := range rep.Requests {
		if want := float64(i) * 0.04; math.Abs(float64(r.Scheduled)-want) > 1e-9 {
			t.Errorf("request %d scheduled at %v, want %v", i, r.Scheduled, want)
		}
		if r.Start < r.Scheduled {
			t.Errorf("request %d started at %v before its arrival %v", i, r.Start, r.Scheduled)
		}
	}
	if el := time.Since(start); el < 360*time.Millisecond || el > 30*time.Second {
		t.Errorf("10 requests at 25/s took %v", el)
	}
	// The server saw them in arrival order, spaced by the schedule (generously).
	seen := e.seen()
	for i := 1; i < len(seen); i++ {
		if seen[i].arrival.Before(seen[i-1].arrival) {
			t.Fatalf("arrivals out of order at %d", i)
		}
	}
	if span := seen[len(seen)-1].arrival.Sub(seen[0].arrival); span < 200*time.Millisecond {
		t.Errorf("10 arrivals at 25/s spread over only %v", span)
	}
	if s := rep.Server; s == nil || !s.CountMatches {
		t.Errorf("server check %+v", s)
	}
}

func TestRunOpenLoopBoundsInFlight(t *testing.T) {
	e := newTestEngine(t, func(e *testEngine) { e.ttft = func(int) time.Duration { return 100 * time.Millisecond } })
	cfg := quick(e)
	cfg.Requests, cfg.Concurrency, cfg.Rate = 12, 3, 1000
	rep := run(t, cfg)
	if rep.Sent != 12 || rep.Failed != 0 {
		t.Fatalf("sent %d failed %d", rep.Sent, rep.Failed)
	}
	if m := e.maxInflight.Load(); m > 3 {
		t.Errorf("%d requests in flight, limit 3", m)
	}
	if rep.Delayed < 1 {
		t.Errorf("no arrival was delayed by the in-flight limit (delayed %d)", rep.Delayed)
	}
	for i, r := range rep.Requests {
		if r.Start < r.Scheduled {
			t.Errorf("request %d started before its arrival", i)
		}
	}
}

func TestRunTinyRateStopsAtDuration(t *testing.T) {
	e := newTestEngine(t, nil)
	cfg := quick(e)
	cfg.Requests, cfg.Rate, cfg.Duration = 5, 1e-15, time.Hour
	rep := run(t, cfg)
	// The first arrival is at 0; the second would be 10¹⁵ s later, past the duration.
	if rep.Sent != 1 || rep.StoppedBy != StoppedByDuration || rep.Failed != 0 {
		t.Fatalf("sent %d, stopped by %s", rep.Sent, rep.StoppedBy)
	}
}

func TestRunPoissonArrivals(t *testing.T) {
	e := newTestEngine(t, nil)
	cfg := quick(e)
	cfg.Requests, cfg.Concurrency, cfg.Rate, cfg.Poisson, cfg.Seed = 8, 8, 200, true, 3
	a := run(t, cfg)
	b := run(t, cfg)
	gaps := map[float64]bool{}
	for i := 1; i < len(a.Requests); i++ {
		g := float64(a.Requests[i].Scheduled - a.Requests[i-1].Scheduled)
		if g < 0 {
			t.Fatalf("arrival %d before %d", i, i-1)
		}
		gaps[math.Round(g*1e6)] = true
		if a.Requests[i].Scheduled != b.Requests[i].Scheduled {
			t.Errorf("arrival %d differs between runs with one seed", i)
		}
	}
	if len(gaps) < 3 {
		t.Errorf("Poisson gaps look evenly spaced: %v", gaps)
	}
}

func TestRunIngestAndNoReuse(t *testing.T) {
	e := newTestEngine(t, nil)
	docs := []Document{{ID: "a", Text: "alpha document text"}, {ID: "b", Text: "beta document text"}, {ID: "c", Text: "gamma document"}}
	cfg := quick(e)
	cfg.Requests, cfg.Concurrency, cfg.Documents, cfg.DocsPerRequest, cfg.Ingest, cfg.NoReuse = 6, 2, docs, 2, true, true
	rep := run(t, cfg)
	if rep.Failed != 0 || !rep.Ingested || rep.Reuse {
		t.Fatalf("report %+v", rep)
	}
	e.mu.Lock()
	got := append([]Document(nil), e.docs...)
	e.mu.Unlock()
	if len(got) != 3 || got[0] != docs[0] || got[1] != docs[1] || got[2] != docs[2] {
		t.Errorf("ingested %v, want %v", got, docs)
	}
	for _, q := range e.seen() {
		if q.body.Cacheblend == nil || q.body.Cacheblend.Reuse == nil || *q.body.Cacheblend.Reuse {
			t.Fatalf("request without cacheblend.reuse=false: %+v", q.body)
		}
	}
}

func TestRunUnhealthyEngine(t *testing.T) {
	e := newTestEngine(t, func(e *testEngine) { e.unhealthy = true })
	cfg := quick(e)
	cfg.HealthWait = 300 * time.Millisecond
	rep, err := Run(context.Background(), cfg)
	if err == nil || rep != nil || !strings.Contains(err.Error(), "not healthy") {
		t.Fatalf("Run = %v, %v", rep, err)
	}
	if n := e.arrivals.Load(); n != 0 {
		t.Errorf("%d requests sent to an unhealthy engine", n)
	}
}

func TestRunCancelled(t *testing.T) {
	e := newTestEngine(t, func(e *testEngine) { e.ttft = func(int) time.Duration { return 20 * time.Millisecond } })
	cfg := quick(e)
	cfg.Requests, cfg.Concurrency = 1_000_000, 2
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	rep, err := Run(ctx, cfg)
	if !errors.Is(err, context.DeadlineExceeded) || rep == nil || rep.StoppedBy != StoppedByCanceled || rep.Server != nil {
		t.Fatalf("Run = %+v, %v", rep, err)
	}
	if rep.Sent == 0 || rep.Sent >= cfg.Requests {
		t.Errorf("sent %d", rep.Sent)
	}
}

func TestRunSkipServerCheckAndScrapeFailure(t *testing.T) {
	e := newTestEngine(t, nil)
	cfg := quick(e)
	cfg.Requests, cfg.SkipServerCheck = 3, true
	if rep := run(t, cfg); rep.Server != nil || rep.Err() != nil {
		t.Fatalf("skipped check: server %+v, err %v", rep.Server, rep.Err())
	}
	cfg.SkipServerCheck, cfg.MetricsURL = false, e.URL()+"/nope"
	rep := run(t, cfg)
	if rep.Server == nil || rep.Server.Error == "" || !errors.Is(rep.Err(), ErrServerCheck) {
		t.Fatalf("unreadable metrics: server %+v, err %v", rep.Server, rep.Err())
	}
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no API", Config{}, "no engine API URL"},
		{"not http", Config{API: "ftp://x"}, "not http"},
		{"negative requests", Config{API: "http://x", Requests: -1}, "requests is negative"},
		{"negative duration", Config{API: "http://x", Duration: -time.Second}, "duration is negative"},
		{"negative concurrency", Config{API: "http://x", Concurrency: -2}, "concurrency is negative"},
		{"NaN rate", Config{API: "http://x", Rate: math.NaN()}, "rate"},
		{"negative rate", Config{API: "http://x", Rate: -1}, "rate"},
		{"too many docs", Config{API: "http://x", DocsPerRequest: 99}, "corpus has"},
		{"empty corpus", Config{API: "http://x", Documents: []Document{}}, "corpus is empty"},
		{"empty document", Config{API: "http://x", Documents: []Document{{ID: "x"}}}, "is empty"},
		{"negative prefix", Config{API: "http://x", MaxPrefix: -1}, "max prefix"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep, err := Run(context.Background(), tc.cfg)
			if rep != nil || !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run = %v, %v; want ErrConfig with %q", rep, err, tc.want)
			}
		})
	}
}

func TestConfigDefaults(t *testing.T) {
	c, err := Config{API: "http://127.0.0.1:8000/"}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if c.API != "http://127.0.0.1:8000" || c.MetricsURL != "http://127.0.0.1:8000/metrics" || c.Requests != DefaultRequests ||
		c.Duration != DefaultDuration || c.Concurrency != DefaultConcurrency || c.Model != DefaultModel ||
		c.MaxTokens != DefaultMaxTokens || c.DocsPerRequest != DefaultDocsPerRequest || len(c.Documents) < DefaultDocsPerRequest ||
		c.Grace != DefaultGrace || c.Rate != 0 || c.MaxPrefix != 0 {
		t.Errorf("defaults %+v", c)
	}
}

// The TTFT of requests the worker took for its quality check is reported
// apart from the other reuse requests' (usage.cacheblend.quality_sampled);
// requests without chunk reuse are in neither.
func TestRunSplitsQualitySampled(t *testing.T) {
	e := newTestEngine(t, func(e *testEngine) {
		// Request i: sampled when i%4 == 0 (TTFT 60 ms), reuse when odd (20 ms), else no reuse (5 ms).
		e.ttft = func(i int) time.Duration {
			switch {
			case i%4 == 0:
				return 60 * time.Millisecond
			case i%2 == 1:
				return 20 * time.Millisecond
			}
			return 5 * time.Millisecond
		}
		e.blend = func(i int) map[string]any {
			switch {
			case i%4 == 0:
				return map[string]any{"non_prefix_hit_tokens": 100, "quality_sampled": true}
			case i%2 == 1:
				return map[string]any{"non_prefix_hit_tokens": 100}
			}
			return map[string]any{"non_prefix_hit_tokens": 0}
		}
	})
	cfg := quick(e)
	cfg.Requests, cfg.Concurrency = 16, 1
	rep := run(t, cfg)
	q := rep.QualitySampled
	if q == nil {
		t.Fatal("no quality split")
	}
	if q.Sampled.N != 4 || q.Others.N != 8 {
		t.Fatalf("sampled %d, others %d; want 4 and 8", q.Sampled.N, q.Others.N)
	}
	// Each side summarises exactly its requests. (Their latencies are
	// only bounded below — the fake engine waits 60 or 20 ms before the
	// first token —: on a loaded machine a 20 ms request can take longer
	// than a 60 ms one, so the sides' order is not checked.)
	var sampledTTFT, othersTTFT []float64
	for _, r := range rep.Requests {
		switch {
		case r.QualitySampled:
			sampledTTFT = append(sampledTTFT, float64(r.TTFT))
		case r.BlendReused > 0:
			othersTTFT = append(othersTTFT, float64(r.TTFT))
		}
	}
	for _, side := range []struct {
		name  string
		got   Summary
		ttfts []float64
		floor float64
	}{{"sampled", q.Sampled, sampledTTFT, 0.06}, {"others", q.Others, othersTTFT, 0.02}} {
		want := Summarize(side.ttfts)
		if side.got.N != want.N || side.got.P50 != want.P50 || side.got.Max != want.Max {
			t.Errorf("%s: %+v, want the summary of its requests %+v", side.name, side.got, want)
		}
		for _, v := range side.ttfts {
			if v < side.floor {
				t.Errorf("%s: a TTFT of %v s, below the engine's %v s wait: a request of another kind", side.name, v, side.floor)
			}
		}
	}
	var out strings.Builder
	rep.Print(&out)
	if !strings.Contains(out.String(), "TTFT quality-sampled") {
		t.Fatalf("report without the split:\n%s", out.String())
	}
	sampled := 0
	for _, r := range rep.Requests {
		if r.QualitySampled {
			sampled++
		}
	}
	if sampled != 4 {
		t.Fatalf("%d results marked sampled", sampled)
	}
}
