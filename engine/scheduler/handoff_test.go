package scheduler

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/engine/internal/enginetest"
)

var testSecret = bytes.Repeat([]byte{1}, SecretBytes)

// pd is a prefill scheduler and a decode scheduler, each with its worker
// double; pulls copy the prefill double's kept KV into the decode double.
type pd struct {
	p, d *harness
}

func newPD(t *testing.T, dcfg Config) *pd {
	return &pd{p: newHarness(t, opts{}), d: newHarness(t, opts{cfg: dcfg, blend: &enginetest.Blend{}})}
}

// prefill runs the prefill half of a hand-over and returns its first token.
func (x *pd) prefill(t *testing.T, id string, p []int32) int32 {
	t.Helper()
	res := run(t, x.p.s, &Request{ID: id, Prompt: p, MaxTokens: 1, HandoffSecret: testSecret})
	if res.Err != nil || res.FinishReason != FinishHandoff || len(res.Tokens) != 1 {
		t.Fatalf("prefill %s: %+v", id, res)
	}
	if !x.p.worker.Kept(id) {
		t.Fatalf("the prefill worker keeps nothing for %s", id)
	}
	return res.Tokens[0]
}

func (x *pd) pull(id string) func(context.Context, []int32, int) (int64, error) {
	return func(_ context.Context, bt []int32, from int) (int64, error) {
		n, err := x.d.worker.CopyKV(x.p.worker, id, bt, from)
		return int64(n) * 4, err
	}
}

// TestHandoffMatchesOneEngine: a request prefilled by one scheduler and
// decoded by another generates the reference tokens; the decode side's
// prefix cache dedups the blocks of a second request sharing the prefix;
// the prefill side holds its blocks until the worker reports the keep's
// end, and everything is freed on both sides afterwards.
func TestHandoffMatchesOneEngine(t *testing.T) {
	x := newPD(t, Config{})
	p1 := prompt(100, 3) // 6 full blocks of 16 and a partial one
	first := x.prefill(t, "h1", p1)
	if st := checkKV(t, x.p.s); st.HandoffsHeld != 1 || st.KVUsed != 7 {
		t.Fatalf("prefill side while kept: %+v", st)
	}
	res := run(t, x.d.s, &Request{ID: "h1", Prompt: p1, MaxTokens: 12, Prefilled: &Prefilled{FirstToken: first, Pull: x.pull("h1")}})
	if res.Err != nil || res.FinishReason != FinishLength {
		t.Fatalf("decode: %+v", res)
	}
	if want := enginetest.Reference(p1, 12); !slices.Equal(res.Tokens, want) {
		t.Fatalf("tokens %v, want %v", res.Tokens, want)
	}
	if tr := res.Transfer; tr == nil || !tr.Done || tr.Blocks != 7 || tr.Deduped != 0 || tr.Sent != 7 || tr.Bytes != 400 || tr.End.Before(tr.Start) {
		t.Fatalf("transfer %+v", res.Transfer)
	}
	steps := x.d.worker.SeqSteps("h1")
	if steps[0].GetIsPrefill() || len(steps[0].GetPromptTokens()) != 100 || steps[0].GetStartPos() != 100 || steps[0].GetTokens()[0] != first {
		t.Fatalf("decode side's first step %v", steps[0])
	}
	if n := x.d.blend.LookupsFor("h1"); n != 0 {
		t.Errorf("the decode side looked the taken-over request up %d times", n)
	}
	for _, sp := range x.d.rec.Ended() {
		if sp.Name() == spanname.CBSchedule || sp.Name() == spanname.CBRequest || sp.Name() == spanname.CBLookupRPC {
			t.Errorf("the decode side recorded %s for a taken-over request", sp.Name())
		}
	}
	waitFor(t, "prefill side's blocks freed", func() bool {
		st := checkKV(t, x.p.s)
		return st.HandoffsHeld == 0 && st.KVUsed == 0
	})
	if slices.Contains(x.p.worker.Finished(), "h1") {
		t.Error("the prefill side sent the handed-over id as finished (the worker had moved it to its keep)")
	}

	// A second prompt sharing the first 5 blocks: those are not sent.
	p2 := slices.Concat(p1[:80], prompt(30, 9)[1:])
	first2 := x.prefill(t, "h2", p2)
	res2 := run(t, x.d.s, &Request{ID: "h2", Prompt: p2, MaxTokens: 5, Prefilled: &Prefilled{FirstToken: first2, Pull: x.pull("h2")}})
	if res2.Err != nil || !slices.Equal(res2.Tokens, enginetest.Reference(p2, 5)) {
		t.Fatalf("second: %+v, want %v", res2, enginetest.Reference(p2, 5))
	}
	if tr := res2.Transfer; tr.Deduped != 5 || tr.Sent != 2 || tr.Blocks != 7 || res2.CachedTokens != 80 {
		t.Fatalf("second transfer %+v, cached %d", tr, res2.CachedTokens)
	}
	waitFor(t, "all freed", func() bool {
		return checkKV(t, x.p.s).KVUsed == 0 && checkKV(t, x.d.s).KVUsed == 0
	})
}

// TestHandoffPullFailsOrIsCanceled: a failed pull fails the request with
// ErrHandoff, a canceled one with ErrCanceled; either way the decode side's
// blocks are freed and the id goes to the worker as finished (it stops a
// pull still writing before the blocks serve another request).
func TestHandoffPullFailsOrIsCanceled(t *testing.T) {
	x := newPD(t, Config{})
	p := prompt(50, 1)
	res := run(t, x.d.s, &Request{ID: "f", Prompt: p, MaxTokens: 4, Prefilled: &Prefilled{FirstToken: 1,
		Pull: func(context.Context, []int32, int) (int64, error) { return 0, errors.New("source gone") }}})
	if !errors.Is(res.Err, ErrHandoff) || res.Transfer == nil || !res.Transfer.Done || res.Transfer.Sent != 0 {
		t.Fatalf("failed pull: %+v", res)
	}
	if ErrorType(res.Err) != "kv_transfer_failed" {
		t.Errorf("error type %q", ErrorType(res.Err))
	}
	waitFor(t, "finished id f", func() bool { return slices.Contains(x.d.worker.Finished(), "f") })

	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{})
	hd, err := x.d.s.Submit(&Request{ID: "c", Prompt: p, MaxTokens: 4, Ctx: ctx, Prefilled: &Prefilled{FirstToken: 1,
		Pull: func(ctx context.Context, _ []int32, _ int) (int64, error) {
			close(started)
			<-ctx.Done()
			return 0, ctx.Err()
		}}})
	if err != nil {
		t.Fatal(err)
	}
	<-started
	if st := x.d.s.Stats(); st.Transferring != 1 || st.KVUsed != 4 {
		t.Fatalf("during the pull: %+v", st)
	}
	cancel()
	r, _ := hd.Wait(context.Background())
	if !errors.Is(r.Err, ErrCanceled) {
		t.Fatalf("canceled pull: %+v", r)
	}
	waitFor(t, "finished id c", func() bool { return slices.Contains(x.d.worker.Finished(), "c") })
	if st := checkKV(t, x.d.s); st.KVUsed != 0 || st.Transferring != 0 {
		t.Fatalf("after: %+v", st)
	}
}

// TestReleaseHandoff: a hand-over that never reached the decode side is
// released by the prefill engine (the worker drops the keep), or, when the
// worker never reports, freed after HandoffTimeout.
func TestReleaseHandoff(t *testing.T) {
	x := newPD(t, Config{})
	x.prefill(t, "r", prompt(40, 2))
	x.p.s.ReleaseHandoff("r")
	x.p.s.ReleaseHandoff("r") // idempotent
	waitFor(t, "released", func() bool { return checkKV(t, x.p.s).KVUsed == 0 && !x.p.worker.Kept("r") })

	w := enginetest.NewWorker(64, 16, 4096)
	h := newHarness(t, opts{worker: w, cfg: Config{HandoffTimeout: 100 * time.Millisecond}})
	res := run(t, h.s, &Request{ID: "e", Prompt: prompt(40, 2), MaxTokens: 1, HandoffSecret: testSecret})
	if res.FinishReason != FinishHandoff {
		t.Fatalf("%+v", res)
	}
	waitFor(t, "expired", func() bool { st := checkKV(t, h.s); return st.KVUsed == 0 && st.HandoffsHeld == 0 })
}

// TestHandoffRequestValidation: bad hand-over requests are refused.
func TestHandoffRequestValidation(t *testing.T) {
	h := newHarness(t, opts{})
	pull := func(context.Context, []int32, int) (int64, error) { return 0, nil }
	for name, r := range map[string]*Request{
		"short secret":         {ID: "a", Prompt: prompt(5, 1), MaxTokens: 1, HandoffSecret: testSecret[:4]},
		"secret on a document": {ID: "b", Prompt: prompt(5, 1), Document: true, HandoffSecret: testSecret},
		"no pull":              {ID: "c", Prompt: prompt(5, 1), MaxTokens: 1, Prefilled: &Prefilled{}},
		"first token outside":  {ID: "d", Prompt: prompt(5, 1), MaxTokens: 1, Prefilled: &Prefilled{FirstToken: 9999, Pull: pull}},
		"negative first token": {ID: "e", Prompt: prompt(5, 1), MaxTokens: 1, Prefilled: &Prefilled{FirstToken: -1, Pull: pull}},
		"both halves":          {ID: "f", Prompt: prompt(5, 1), MaxTokens: 1, HandoffSecret: testSecret, Prefilled: &Prefilled{Pull: pull}},
	} {
		if _, err := h.s.Submit(r); !errors.Is(err, ErrBadRequest) {
			t.Errorf("%s: %v", name, err)
		}
	}
}
