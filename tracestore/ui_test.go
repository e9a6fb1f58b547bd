package tracestore

import (
	"context"
	"fmt"
	"math"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/tracestore/tracetest"
)

const chromiumPath = "/usr/bin/chromium"

// uiScreenshot is where TestWebUIInChromium leaves a screenshot for people to look at.
const uiScreenshot = "/tmp/tracestore-ui.png"

// uiListScreenshot shows the request list.
const uiListScreenshot = "/tmp/tracestore-ui-list.png"

// TestWebUIInChromium loads the web page in headless Chromium against a store holding
// three-service requests: the list shows them, a trace renders one lane per process, and
// the "where the time went" total read from the page equals the root's duration.
func TestWebUIInChromium(t *testing.T) {
	if _, err := os.Stat(chromiumPath); err != nil {
		t.Fatalf("headless Chromium is required at %s for the web page test: run `make deps` (installs Debian's chromium package): %v", chromiumPath, err)
	}
	store := NewStore(StoreConfig{})
	base := time.Now().Add(-time.Minute)
	for i, r := range []tracetest.Request{
		{RequestID: "req-a", Start: base},
		{RequestID: "req-b", Start: base.Add(time.Second), Scale: 2.5, PrefixHit: 0, NonPrefixHit: 700, PromptTokens: 1400},
		{RequestID: "req-c", Start: base.Add(2 * time.Second), Scale: 1.3, OutputTokens: 100},
	} {
		if res := store.Add(r.Traces()); res.Accepted != 22 {
			t.Fatalf("request %d: %+v", i, res)
		}
	}
	// The worker's quality check of req-a: its own trace, linked to req-a's forward.
	check := tracetest.Quality{RequestID: "req-a", Start: base.Add(500 * time.Millisecond)}
	if res := store.Add(check.Traces()); res.Accepted != 1 {
		t.Fatalf("quality check: %+v", res)
	}
	srv := httptest.NewServer(NewQueryHandler(store, NewReceiver(store, ReceiverConfig{})))
	defer srv.Close()

	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromiumPath),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1480, 1000),
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(allocCtx)
	defer cancelBrowser()
	ctx, cancel := context.WithTimeout(bctx, 90*time.Second)
	defer cancel()

	// Collect JavaScript exceptions and console errors for the whole visit.
	var mu sync.Mutex
	var jsErrors []string
	messages := chromedp.Console(ctx)
	collected := make(chan struct{})
	go func() {
		defer close(collected)
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.IsException() || m.Type == chromedp.ConsoleError {
				mu.Lock()
				jsErrors = append(jsErrors, m.String()+" "+m.URL)
				mu.Unlock()
			}
		}
	}()
	defer func() { cancel(); <-collected }()

	// The request list.
	if err := chromedp.Do(ctx,
		chromedp.Navigate(srv.URL+"/"),
		chromedp.WaitVisible(chromedp.CSS(`#requests tbody tr`)),
	); err != nil {
		t.Fatalf("loading the request list: %v", err)
	}
	rowIDs, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll('#requests tbody tr')].map(r => r.children[1].textContent + ' ' + r.children[3].textContent)`))
	if err != nil {
		t.Fatalf("reading the request list: %v", err)
	}
	if got, want := strings.Join(rowIDs, ","), "req-c chat m1,req-b chat m1,req-a cb.quality,req-a chat m1"; got != want {
		t.Fatalf("request list = %v, want newest first %s", got, want)
	}

	if list, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)); err == nil {
		_ = os.WriteFile(uiListScreenshot, list, 0o644)
	}

	// One trace: lanes, waterfall, breakdown.
	tid := tracetest.TraceID("req-a").String()
	if err := chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(fmt.Sprintf(`#requests tbody tr[data-trace-id="%s"]`, tid))),
		chromedp.WaitVisible(chromedp.CSS(`#breakdown-total`)),
	); err != nil {
		t.Fatalf("opening trace %s: %v", tid, err)
	}
	type pageData struct {
		Lanes      []string `json:"lanes"`
		LaneNames  []string `json:"laneNames"`
		Rows       int      `json:"rows"`
		Critical   int      `json:"critical"`
		GroupTexts []string `json:"groupTexts"`
		TotalText  string   `json:"totalText"`
		TotalNs    string   `json:"totalNs"`
		DurNs      string   `json:"durNs"`
	}
	pd, err := chromedp.Run(ctx, chromedp.Evaluate[pageData](`({
		lanes: [...document.querySelectorAll('#lanes .lane')].map(l => l.dataset.service),
		laneNames: [...document.querySelectorAll('#lanes .lane')].map(l => l.dataset.lane),
		rows: document.querySelectorAll('#waterfall .wf-row').length,
		critical: document.querySelectorAll('#waterfall .wf-row.on-critical').length,
		groupTexts: [...document.querySelectorAll('#breakdown tbody tr.group td.ms')].map(td => td.textContent),
		totalText: document.querySelector('#breakdown-total').textContent,
		totalNs: document.querySelector('#breakdown-total').dataset.ns,
		durNs: document.querySelector('#trace-duration').dataset.ns,
	})`))
	if err != nil {
		t.Fatalf("reading trace %s: %v", tid, err)
	}
	if strings.Join(pd.Lanes, ",") != "cb-engine,cb-worker,cb-blend" {
		t.Fatalf("lanes = %v, want one per process", pd.Lanes)
	}
	// Lanes are process instances, labelled with service.instance.id.
	if strings.Join(pd.LaneNames, ",") != "cb-engine@cb-engine-0,cb-worker@cb-worker-0,cb-blend@cb-blend-0" {
		t.Fatalf("lane names = %v, want node-qualified instances", pd.LaneNames)
	}
	if pd.Rows != 22 {
		t.Fatalf("waterfall rows = %d, want 22", pd.Rows)
	}
	if pd.Critical == 0 {
		t.Fatal("no span marked on the critical path")
	}
	var sum float64
	for _, s := range pd.GroupTexts {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			t.Fatalf("breakdown cell %q: %v", s, err)
		}
		sum += v
	}
	total, err := strconv.ParseFloat(pd.TotalText, 64)
	if err != nil {
		t.Fatalf("breakdown total %q: %v", pd.TotalText, err)
	}
	tns, _ := strconv.ParseFloat(pd.TotalNs, 64)
	dns, _ := strconv.ParseFloat(pd.DurNs, 64)
	rootMs := dns / 1e6
	if rootMs != 180 {
		t.Fatalf("root duration on the page = %v ms, want 180", rootMs)
	}
	// The shown rows are rounded to 0.001 ms each.
	if math.Abs(sum-rootMs) > 0.0005*float64(len(pd.GroupTexts))+1e-9 || math.Abs(total-rootMs) > 0.0005 || math.Abs(tns-dns) > 1 {
		t.Fatalf("breakdown rows sum to %.3f ms, total shows %s ms (%s ns); root is %.3f ms", sum, pd.TotalText, pd.TotalNs, rootMs)
	}

	// The quality check next to the reuse facts, with a link to its trace.
	type qualityData struct {
		Text string `json:"text"`
		Href string `json:"href"`
		KL   string `json:"kl"`
	}
	qd, err := chromedp.Run(ctx, chromedp.Evaluate[qualityData](`(() => {
		const q = document.querySelector('#linked .quality');
		return q ? { text: q.textContent, href: q.querySelector('a').getAttribute('href'), kl: q.dataset.firstKl } : { text: '', href: '', kl: '' };
	})()`))
	if err != nil {
		t.Fatalf("reading the quality box: %v", err)
	}
	for _, want := range []string{"first-token KL 0.0031", "mean KL 0.0024 over 4 tokens", "top-1 4/4", "greedy match 4/4", "recompute ratio 15.0 %, 77 tokens selected", "checked in trace"} {
		if !strings.Contains(qd.Text, want) {
			t.Fatalf("quality box lacks %q: %q", want, qd.Text)
		}
	}
	if qid := tracetest.QualityTraceID("req-a").String(); qd.Href != "#/trace/"+qid || qd.KL != "0.0031" {
		t.Fatalf("quality box links %q (first_kl %q), want #/trace/%s", qd.Href, qd.KL, qid)
	}

	// Span details on click.
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(fmt.Sprintf(`.wf-row[data-span-id="%s"]`, tracetest.SpanID("req-a", spanname.CBScatter))))); err != nil {
		t.Fatalf("selecting cb.scatter: %v", err)
	}
	detail, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(`#span-detail`)))
	if err != nil {
		t.Fatalf("reading the span detail: %v", err)
	}
	for _, want := range []string{spanname.CBScatter, "scattered_tokens", "768", "n_shifted_tokens", "cb-blend"} {
		if !strings.Contains(detail, want) {
			t.Fatalf("span detail lacks %q:\n%s", want, detail)
		}
	}

	if err := chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](`window.scrollTo(0, 0)`)); err != nil {
		t.Fatalf("scrolling up: %v", err)
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if err := os.WriteFile(filepath.Join(t.TempDir(), "ui.png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(uiScreenshot, png, 0o644); err != nil {
		t.Logf("could not leave a screenshot at %s: %v", uiScreenshot, err)
	}
	// The check's own trace names the request it checked.
	if err := chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(`#linked .quality a`)),
		chromedp.WaitVisible(chromedp.CSS(`#linked .links-to`)),
	); err != nil {
		t.Fatalf("opening the quality check's trace: %v", err)
	}
	back, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('#linked .links-to a').getAttribute('href')`))
	if err != nil || back != "#/trace/"+tid {
		t.Fatalf("the check's trace links to %q (%v), want #/trace/%s", back, err, tid)
	}

	// Let late console messages arrive, then stop collecting.
	if err := chromedp.Do(ctx, chromedp.Sleep(200*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	cancel()
	<-collected
	mu.Lock()
	defer mu.Unlock()
	if len(jsErrors) > 0 {
		t.Fatalf("JavaScript errors on the page: %v", jsErrors)
	}
}
