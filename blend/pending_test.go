package blend

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/cacheblend/cacheblend/blend/fingerprint"
	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/reuseplan"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
)

// spanOf returns the span named name of the lookup whose request_id is id.
func spanOf(t *testing.T, spans tracetest.SpanStubs, name, id string) tracetest.SpanStub {
	t.Helper()
	for _, s := range spansNamed(spans, name) {
		if v, ok := attr(s, "request_id"); ok && v.AsString() == id {
			return s
		}
	}
	t.Fatalf("no %s span of %s", name, id)
	return tracetest.SpanStub{}
}

// TestLookupSeesStoresInFlight: a lookup that would match the chunks of a
// store whose fingerprint registration has not happened yet (the
// registration goroutine is held) waits for it within its deadline and
// reuses the document; past its deadline it answers without them and counts
// them pending in cb.classify; a lookup the store in flight adds nothing to
// does not wait.
func TestLookupSeesStoresInFlight(t *testing.T) {
	cases := []struct {
		name string
		// registered: the document was stored and registered before (at
		// another position), so the store in flight adds nothing.
		registered  bool
		docInPrompt bool
		deadline    time.Duration // of the lookup's caller
		release     time.Duration // when the held registration goes on (0: after the lookup)
		wantHit     int
		wantPending int64
		minWait     time.Duration
		maxWait     time.Duration
	}{
		{name: "registered while the lookup waits", docInPrompt: true, deadline: 5 * time.Second, release: 150 * time.Millisecond,
			wantHit: docLen, minWait: 140 * time.Millisecond, maxWait: time.Second},
		{name: "deadline first: pending", docInPrompt: true, deadline: 600 * time.Millisecond,
			wantHit: 0, wantPending: 2, minWait: 400 * time.Millisecond, maxWait: 500 * time.Millisecond},
		{name: "prompt without the document: no wait", deadline: 5 * time.Second, wantHit: 0, maxWait: 50 * time.Millisecond},
		{name: "document registered already: no wait", registered: true, docInPrompt: true, deadline: 5 * time.Second,
			wantHit: docLen, maxWait: 50 * time.Millisecond},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, Config{})
			mem := e.newWorker("w0", 0)
			r := rand.New(rand.NewPCG(uint64(i), 5))
			doc := tokens(r, docLen, 1000, 1000)
			bt := blocks(docBlock, (docLen+bs-1)/bs)
			e.prefill(mem, bt, docSeq, docLen)
			if tc.registered {
				// The document alone, at position 0, stored and registered.
				if _, err := e.c.Store(ctxT(t), &cbv1.StoreRequest{RequestId: "first", WorkerId: "w0", Tokens: doc, BlockTable: bt, Model: testModel}); err != nil {
					t.Fatal(err)
				}
				e.s.waitRegistrations(t)
			}
			release := make(chan struct{})
			var once sync.Once
			free := func() { once.Do(func() { close(release) }) }
			defer free()
			blockQueue(t, e.s.chunks.regQ, release) // the registration goroutine is busy

			// The store in flight: the document after 100 other tokens.
			seqToks := append(tokens(r, 100, 5000, 1000), doc...)
			sbt := blocks(30, (len(seqToks)+bs-1)/bs)
			e.prefill(mem, sbt, docSeq+1, len(seqToks))
			if _, err := e.c.Store(ctxT(t), &cbv1.StoreRequest{RequestId: "in-flight", WorkerId: "w0", Tokens: seqToks, BlockTable: sbt, Model: testModel}); err != nil {
				t.Fatal(err)
			}
			if n := e.s.chunks.inflight.inFlight(); n != 1 {
				t.Fatalf("%d stores in flight, want 1", n)
			}

			prompt := tokens(rand.New(rand.NewPCG(uint64(i), 9)), promptN, 3000, 1000)
			if tc.docInPrompt {
				copy(prompt[700:], doc)
			}
			if tc.release > 0 {
				time.AfterFunc(tc.release, free)
			}
			ctx, cancel := context.WithTimeout(ctxT(t), tc.deadline)
			defer cancel()
			t0 := time.Now()
			res, err := e.c.Lookup(ctx, &cbv1.LookupRequest{RequestId: "second", Tokens: prompt, WorldSize: 1, Model: testModel})
			took := time.Since(t0)
			if err != nil {
				t.Fatalf("lookup: %v", err)
			}
			free()
			e.s.waitRegistrations(t)
			if n := e.s.chunks.inflight.inFlight(); n != 0 {
				t.Errorf("%d stores in flight after the registration, want 0", n)
			}
			if got := int(res.GetNonPrefixHitTokens()); got != tc.wantHit {
				t.Errorf("non-prefix hit tokens %d, want %d (%+v)", got, tc.wantHit, res)
			}
			if took < tc.minWait || took > tc.maxWait+200*time.Millisecond {
				t.Errorf("lookup took %v, want %v..%v", took, tc.minWait, tc.maxWait)
			}
			e.shutdown()
			spans := e.exp.GetSpans()
			cl := spanOf(t, spans, spanname.CBClassify, "second")
			if got := intAttr(t, cl, "pending"); got != tc.wantPending {
				t.Errorf("cb.classify pending %d, want %d", got, tc.wantPending)
			}
			lk := spanOf(t, spans, spanname.CBLookup, "second")
			v, ok := attr(lk, attribute.Key("pending_wait_ms"))
			if !ok {
				t.Fatal("cb.lookup has no pending_wait_ms")
			}
			if w := time.Duration(v.AsFloat64() * float64(time.Millisecond)); w < tc.minWait || w > tc.maxWait {
				t.Errorf("pending_wait_ms %v, want %v..%v", w, tc.minWait, tc.maxWait)
			}
			t.Logf("non-prefix hit %d tokens, lookup %v, pending %d", res.GetNonPrefixHitTokens(), took.Round(time.Millisecond), intAttr(t, cl, "pending"))
		})
	}
}

// TestBackToBackLookupsReuseANewDocument: a store and the lookups of a
// burst sent as it begins, without holding anything: from the first lookup
// on, each reuses the document (the lookups wait for the store's
// registration instead of missing it).
func TestBackToBackLookupsReuseANewDocument(t *testing.T) {
	e := newEnv(t, Config{})
	mem := e.newWorker("w0", 0)
	r := rand.New(rand.NewPCG(3, 3))
	doc := tokens(r, docLen, 1000, 1000)
	bt := blocks(docBlock, (docLen+bs-1)/bs)
	e.prefill(mem, bt, docSeq, docLen)
	release := make(chan struct{})
	blockQueue(t, e.s.chunks.regQ, release) // the registration is the slow part here: held 100 ms
	time.AfterFunc(100*time.Millisecond, func() { close(release) })
	if _, err := e.c.Store(ctxT(t), &cbv1.StoreRequest{RequestId: "first", WorkerId: "w0", Tokens: doc, BlockTable: bt, Model: testModel}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	hits := make([]int32, 8)
	for i := range hits {
		wg.Go(func() {
			off := 50 + 97*i
			res, err := e.c.Lookup(ctxT(t), &cbv1.LookupRequest{RequestId: fmt.Sprint("burst-", i), Tokens: promptWith(promptN, off, doc, uint64(i)), WorldSize: 1, Model: testModel})
			if err != nil {
				t.Error(err)
				return
			}
			hits[i] = res.GetNonPrefixHitTokens()
		})
	}
	wg.Wait()
	for i, h := range hits {
		if h != docLen {
			t.Errorf("lookup %d reused %d tokens, want %d", i, h, docLen)
		}
	}
	t.Logf("non-prefix hits of the burst: %v", hits)
}

// TestLookupWaitsForNamedStores: a lookup that names a store of its
// engine not yet arrived (LookupRequest.pending_store_ids: the worker sends
// it from a goroutine, the lookup overtook it) waits until the store
// arrives, then for its registration, and reuses the document; a store that
// never arrives bounds the wait by the deadline; a refused store ends the
// wait; a store not named is missed (the race the field closes).
func TestLookupWaitsForNamedStores(t *testing.T) {
	cases := []struct {
		name string
		// name: the lookup names the store; storeAt: when the store is sent
		// after the lookup (negative: before it; 0: never); refused: the
		// store is refused (another worker's id).
		named     bool
		storeAt   time.Duration
		refused   bool
		deadline  time.Duration
		wantHit   int
		unarrived int64
		// minWait, maxWait bound the lookup's time and its pending_wait_ms.
		// A lookup that waits for a store sent later (named, storeAt > 0)
		// is bounded below by when the store was sent instead of a fixed
		// minimum: it must end after it, and its pending_wait_ms (timed from
		// the lookup's start on the server) must cover the time from
		// cb.lookup's start to it (a fixed minimum from the test's own clock
		// failed when a loaded machine delayed the lookup's arrival).
		minWait time.Duration
		maxWait time.Duration
	}{
		{name: "store arrives while the lookup waits", named: true, storeAt: 150 * time.Millisecond, deadline: 5 * time.Second,
			wantHit: docLen, maxWait: time.Second},
		{name: "store arrived before: no wait", named: true, storeAt: -1, deadline: 5 * time.Second,
			wantHit: docLen, maxWait: 50 * time.Millisecond},
		{name: "store never arrives: the deadline bounds the wait", named: true, deadline: 600 * time.Millisecond,
			unarrived: 1, minWait: 400 * time.Millisecond, maxWait: 500 * time.Millisecond},
		{name: "store refused: the wait ends", named: true, storeAt: 100 * time.Millisecond, refused: true, deadline: 5 * time.Second,
			maxWait: 400 * time.Millisecond},
		{name: "store not named: missed", storeAt: 150 * time.Millisecond, deadline: 5 * time.Second, maxWait: 50 * time.Millisecond},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, Config{})
			mem := e.newWorker("w0", 0)
			r := rand.New(rand.NewPCG(uint64(i), 7))
			doc := tokens(r, docLen, 1000, 1000)
			seqToks := append(tokens(r, 100, 5000, 1000), doc...)
			sbt := blocks(30, (len(seqToks)+bs-1)/bs)
			e.prefill(mem, sbt, docSeq, len(seqToks))
			worker := "w0"
			if tc.refused {
				worker = "ghost"
			}
			var storeSent time.Time // written before sent.Done, read after sent.Wait
			store := func() {
				storeSent = time.Now()
				_, err := e.c.Store(ctxT(t), &cbv1.StoreRequest{RequestId: "first", WorkerId: worker, Tokens: seqToks, BlockTable: sbt, Model: testModel})
				if (err != nil) != tc.refused {
					t.Errorf("store: %v (refused %v)", err, tc.refused)
				}
			}
			var sent sync.WaitGroup
			switch {
			case tc.storeAt < 0:
				store()
				e.s.waitRegistrations(t)
			case tc.storeAt > 0:
				sent.Add(1)
				time.AfterFunc(tc.storeAt, func() { defer sent.Done(); store() })
			}
			req := &cbv1.LookupRequest{RequestId: "second", Tokens: promptWith(promptN, 700, doc, uint64(i)), WorldSize: 1, Model: testModel}
			if tc.named {
				req.PendingStoreIds = []string{"first"}
			}
			ctx, cancel := context.WithTimeout(ctxT(t), tc.deadline)
			defer cancel()
			t0 := time.Now()
			res, err := e.c.Lookup(ctx, req)
			end := time.Now()
			took := end.Sub(t0)
			if err != nil {
				t.Fatalf("lookup: %v", err)
			}
			sent.Wait()
			waits := tc.named && tc.storeAt > 0
			if waits && end.Before(storeSent) {
				t.Errorf("lookup returned %v before the store it waits for was sent", storeSent.Sub(end))
			}
			e.s.waitRegistrations(t)
			if got := int(res.GetNonPrefixHitTokens()); got != tc.wantHit {
				t.Errorf("non-prefix hit tokens %d, want %d", got, tc.wantHit)
			}
			if took < tc.minWait || took > tc.maxWait+200*time.Millisecond {
				t.Errorf("lookup took %v, want %v..%v", took, tc.minWait, tc.maxWait)
			}
			e.shutdown()
			lk := spanOf(t, e.exp.GetSpans(), spanname.CBLookup, "second")
			if got := intAttr(t, lk, "unarrived_stores"); got != tc.unarrived {
				t.Errorf("cb.lookup unarrived_stores %d, want %d", got, tc.unarrived)
			}
			v, _ := attr(lk, attribute.Key("pending_wait_ms"))
			minWait := tc.minWait
			if waits {
				// The wait is timed from the lookup's start, which is cb.lookup's
				// start; it cannot end before the store it waits for was sent.
				minWait = storeSent.Sub(lk.StartTime)
			}
			if w := time.Duration(v.AsFloat64() * float64(time.Millisecond)); w < minWait || w > tc.maxWait {
				t.Errorf("pending_wait_ms %v, want %v..%v", w, minWait, tc.maxWait)
			}
			if waits && lk.EndTime.Before(storeSent) {
				t.Errorf("cb.lookup span ended %v before the store it waits for was sent", storeSent.Sub(lk.EndTime))
			}
			t.Logf("non-prefix hit %d tokens, lookup %v", res.GetNonPrefixHitTokens(), took.Round(time.Millisecond))
		})
	}
}

func TestMergeMatches(t *testing.T) {
	m := func(start, end int) fingerprint.Match {
		return fingerprint.Match{Match: reuseplan.Match{Cur: reuseplan.Range{Start: start, End: end}}}
	}
	ranges := func(ms []fingerprint.Match) [][2]int {
		var out [][2]int
		for _, x := range ms {
			out = append(out, [2]int{x.Cur.Start, x.Cur.End})
		}
		return out
	}
	for _, tc := range []struct {
		name string
		a, b []fingerprint.Match
		want [][2]int
	}{
		{"none from b", []fingerprint.Match{m(0, 10)}, nil, [][2]int{{0, 10}}},
		{"disjoint: both, in order", []fingerprint.Match{m(100, 200)}, []fingerprint.Match{m(0, 50)}, [][2]int{{0, 50}, {100, 200}}},
		{"overlap: the longer", []fingerprint.Match{m(0, 50)}, []fingerprint.Match{m(10, 300)}, [][2]int{{10, 300}}},
		{"fleet found nothing: the local ones", nil, []fingerprint.Match{m(5, 20), m(40, 90)}, [][2]int{{5, 20}, {40, 90}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ranges(mergeMatches(tc.a, tc.b)); !slices.Equal(got, tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}
