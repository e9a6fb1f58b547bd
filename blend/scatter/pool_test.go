package scatter

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/cacheblend/cacheblend/rope"
)

func TestPoolRunsJobs(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	rope := rope.New(kvLayout.HeadDim, theta)
	p := NewPool(PoolConfig{Workers: 2, QueueSize: 8})
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := p.Start(context.Background()); err == nil {
		t.Fatal("second Start succeeded")
	}
	var outs []<-chan Result
	done := make(chan Result, 6)
	for i := range 6 {
		c := newChunk(t, r, kvLayout, 12, 100)
		m, want := newMem(t, kvLayout), newMem(t, kvLayout)
		bt := []int32{int32(i), int32(i + 6), 15}
		cp := rawCopy(want, bt, rope, 0, seg{c, 1, 10, 1, i%2 == 0})
		reference(want, cp)
		cp.Dst = m
		outs = append(outs, p.Submit(Job{Copy: cp, Done: func(r Result) { done <- r }}))
		t.Cleanup(func() { memEqual(t, m, want) })
	}
	for _, out := range outs {
		res := <-out
		if res.Err != nil || res.Stats.ScatteredTokens != 10 || res.Stats.PartialBlocks != 2 || res.Inline {
			t.Fatalf("result %+v", res)
		}
		if res.End.Before(res.Start) || res.Start.Before(res.Queued) {
			t.Fatalf("times out of order: %+v", res)
		}
		if cb := <-done; cb.Stats.ScatteredTokens != 10 {
			t.Fatalf("Done callback got %+v", cb)
		}
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if res := <-p.Submit(Job{}); !errors.Is(res.Err, ErrPoolClosed) {
		t.Fatalf("submit after shutdown: %v", res.Err)
	}
	if st := p.Stats(); st.Submitted != 6 || st.Completed != 6 || st.Rejected != 1 || st.Inline != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestPoolFullQueueRunsInline(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 8))
	p := NewPool(PoolConfig{Workers: 1, QueueSize: 1})
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	c := newChunk(t, r, kvLayout, 4, 0)
	job := func(done func(Result)) Job {
		return Job{Copy: rawCopy(newMem(t, kvLayout), []int32{3}, nil, 0, seg{c, 0, 4, 0, false}), Done: done}
	}
	started, release := make(chan struct{}), make(chan struct{})
	// The worker is held inside the first job's Done callback.
	first := p.Submit(job(func(Result) { close(started); <-release }))
	<-started
	second := p.Submit(job(nil)) // fills the queue
	third := p.Submit(job(nil))  // queue full: runs inline, result ready now
	select {
	case res := <-third:
		if !res.Inline || res.Err != nil || res.Stats.ScatteredTokens != 4 {
			t.Fatalf("inline result %+v", res)
		}
	default:
		t.Fatal("inline job not finished when Submit returned")
	}
	close(release)
	for _, out := range []<-chan Result{first, second} {
		if res := <-out; res.Inline || res.Stats.ScatteredTokens != 4 {
			t.Fatalf("queued result %+v", res)
		}
	}
	if st := p.Stats(); st.Inline != 1 || st.Submitted != 3 || st.Completed != 3 {
		t.Fatalf("stats %+v", st)
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestPoolShutdownDrainsQueue(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	p := NewPool(PoolConfig{Workers: 1, QueueSize: 16})
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	c := newChunk(t, r, kvLayout, 4, 0)
	var outs []<-chan Result
	for range 10 {
		outs = append(outs, p.Submit(Job{Copy: rawCopy(newMem(t, kvLayout), []int32{2}, nil, 0, seg{c, 0, 4, 0, false})}))
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, out := range outs {
		if res := <-out; res.Err != nil || res.Stats.ScatteredTokens != 4 {
			t.Fatalf("result %+v", res)
		}
	}
	// Shutdown of a never-started pool and a second Shutdown are fine.
	if err := NewPool(PoolConfig{}).Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}
