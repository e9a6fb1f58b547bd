package tracestore

import (
	"bytes"
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/cacheblend/cacheblend/tracestore/tracetest"
)

// TestStartIndex checks the skip list against a sorted reference under random inserts,
// moves (a trace's start moving earlier) and removals.
func TestStartIndex(t *testing.T) {
	tests := []struct {
		name      string
		ops, keys int
		starts    int64 // start values drawn from [0, starts): small means many ties
	}{
		{"few keys, many ties", 2000, 20, 5},
		{"many keys", 20000, 2000, 1 << 40},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 2))
			var x startIndex
			x.init()
			in := map[int]*traceRec{}
			for op := range tc.ops {
				k := rng.IntN(tc.keys)
				rec, ok := in[k]
				switch {
				case !ok:
					rec = &traceRec{start: rng.Int64N(tc.starts)}
					rec.id[0], rec.id[1] = byte(k>>8), byte(k)
					x.insert(rec)
					in[k] = rec
				case rng.IntN(2) == 0:
					x.remove(rec)
					rec.start -= rng.Int64N(3)
					x.insert(rec)
				default:
					x.remove(rec)
					delete(in, k)
				}
				if op%97 == 0 || op == tc.ops-1 {
					want := make([]*traceRec, 0, len(in))
					for _, r := range in {
						want = append(want, r)
					}
					slices.SortFunc(want, func(a, b *traceRec) int {
						return cmp.Or(cmp.Compare(b.start, a.start), bytes.Compare(a.id[:], b.id[:]))
					})
					var got []*traceRec
					for n := x.first(); n != nil; n = n.next[0] {
						got = append(got, n.rec)
					}
					if !slices.Equal(got, want) {
						t.Fatalf("op %d: index order differs from the sorted reference (%d vs %d traces)", op, len(got), len(want))
					}
				}
			}
		})
	}
}

// TestRequestsOrderFollowsEarlierSpans: a trace whose earlier span arrives later moves in
// the request list; ties are broken by trace id; FindTraces uses the same order.
func TestRequestsOrderFollowsEarlierSpans(t *testing.T) {
	s := NewStore(StoreConfig{})
	add := func(key string, startMs float64) {
		s.Add(build(key, sp{name: fmt.Sprint("root-", startMs), start: startMs, end: startMs + 1}))
	}
	add("a", 10)
	add("b", 20)
	add("c", 30)
	order := func() []string {
		rows, _ := s.Requests(0, 0)
		var ids []string
		for _, r := range rows {
			ids = append(ids, r.TraceID)
		}
		return ids
	}
	if got, want := order(), []string{traceIDOf("c"), traceIDOf("b"), traceIDOf("a")}; !slices.Equal(got, want) {
		t.Fatalf("order = %v, want %v", got, want)
	}
	add("c", 5) // an earlier span of c: c is now the oldest
	if got, want := order(), []string{traceIDOf("b"), traceIDOf("a"), traceIDOf("c")}; !slices.Equal(got, want) {
		t.Fatalf("order after c moved = %v, want %v", got, want)
	}
	rows, total := s.Requests(1, 1)
	if total != 3 || len(rows) != 1 || rows[0].TraceID != traceIDOf("a") {
		t.Fatalf("Requests(1, 1) = %+v, %d", rows, total)
	}
	if rows, _ := s.Requests(5, 7); len(rows) != 0 {
		t.Fatalf("offset past the end: %+v", rows)
	}
}

// TestRequestRowsAreCopies: a caller changing a returned row does not change the index.
func TestRequestRowsAreCopies(t *testing.T) {
	s := NewStore(StoreConfig{})
	s.Add(tracetest.Request{RequestID: "r"}.Traces())
	row, _ := s.Request(traceIDOf("r"))
	*row.HitRate = 42
	row.Services[0] = "changed"
	again, _ := s.Request(traceIDOf("r"))
	if *again.HitRate == 42 || again.Services[0] == "changed" {
		t.Fatalf("the memoized row was changed through a returned copy: %+v", again)
	}
}

// TestDuplicateSpanRecharges: replacing a span by its retry swaps its size in the budget.
func TestDuplicateSpanRecharges(t *testing.T) {
	mk := func(n int) ptrace.Traces {
		td := ptrace.NewTraces()
		ps := td.ResourceSpans().AppendEmpty().ScopeSpans().AppendEmpty().Spans().AppendEmpty()
		ps.SetTraceID(tracetest.TraceID("dup"))
		ps.SetSpanID(tracetest.SpanID("dup", "a"))
		ps.SetStartTimestamp(pcommon.Timestamp(10))
		ps.SetEndTimestamp(pcommon.Timestamp(5))
		for i := range n {
			ps.Attributes().PutStr(fmt.Sprint("k", i), "some value")
		}
		return td
	}
	s := NewStore(StoreConfig{})
	s.Add(mk(1))
	small := s.Stats().Bytes
	s.Add(mk(50))
	big := s.Stats().Bytes
	s.Add(mk(1))
	st := s.Stats()
	if big <= small || st.Bytes != small || st.Spans != 1 || st.DuplicateSpans != 2 {
		t.Fatalf("bytes %d → %d → %d; stats %+v", small, big, st.Bytes, st)
	}
	if row, _ := s.Request(traceIDOf("dup")); row.NegativeSpans != 1 {
		t.Fatalf("negative spans after replacements = %d, want 1", row.NegativeSpans)
	}
}

// checkAccounting recomputes the store's byte and span accounting from its contents.
func checkAccounting(t *testing.T, s *Store) {
	t.Helper()
	s.mu.RLock()
	defer s.mu.RUnlock()
	var total int64
	spans := 0
	for _, rec := range s.traces {
		want := traceOverhead
		held := map[any]bool{}
		for _, sp := range rec.spans {
			want += sp.size
			for _, p := range []any{sp.res, sp.scope} {
				if !held[p] {
					held[p] = true
					switch p := p.(type) {
					case *resource:
						want += p.size + sharedEntry
					case *scope:
						want += p.size + sharedEntry
					}
				}
			}
		}
		if rec.bytes != want || len(held) != len(rec.shared) {
			t.Fatalf("trace %s: bytes %d, recomputed %d; shared %d, held %d", rec.id, rec.bytes, want, len(rec.shared), len(held))
		}
		if rec.bytes > s.cfg.MaxBytes || len(rec.spans) == 0 || rec.node == nil || rec.node.start != rec.start {
			t.Fatalf("trace %s: %d bytes, %d spans, indexed %v", rec.id, rec.bytes, len(rec.spans), rec.node != nil)
		}
		total += rec.bytes
		spans += len(rec.spans)
	}
	if total != s.bytes || spans != s.nSpans || s.bytes > s.cfg.MaxBytes || s.nSpans > s.cfg.MaxSpans || len(s.traces) > s.cfg.MaxTraces {
		t.Fatalf("store: bytes %d (sum %d, max %d), spans %d (sum %d)", s.bytes, total, s.cfg.MaxBytes, s.nSpans, spans)
	}
}

// TestAccountingUnderRandomTraffic adds random batches (new spans, retries with other
// resources and sizes, several traces per batch) under tight limits and recomputes the
// accounting after each.
func TestAccountingUnderRandomTraffic(t *testing.T) {
	tests := []struct {
		name string
		cfg  StoreConfig
	}{
		{"byte budget binds", StoreConfig{MaxBytes: 200 << 10, MaxAttributes: 16}},
		{"span cap binds", StoreConfig{MaxSpans: 300}},
		{"trace cap binds", StoreConfig{MaxTraces: 7}},
		{"traces alone over the budget", StoreConfig{MaxBytes: 24 << 10}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(3, 4))
			s := NewStore(tc.cfg)
			for range 300 {
				td := ptrace.NewTraces()
				for range 1 + rng.IntN(3) {
					rs := td.ResourceSpans().AppendEmpty()
					rs.Resource().Attributes().PutStr("service.name", fmt.Sprint("svc", rng.IntN(4)))
					for range rng.IntN(5) {
						rs.Resource().Attributes().PutStr(fmt.Sprint("r", rng.IntN(40)), "resource value")
					}
					ss := rs.ScopeSpans().AppendEmpty()
					ss.Scope().SetName(fmt.Sprint("scope", rng.IntN(3)))
					for range rng.IntN(40) {
						key := fmt.Sprint("t", rng.IntN(30))
						ps := ss.Spans().AppendEmpty()
						ps.SetTraceID(tracetest.TraceID(key))
						ps.SetSpanID(tracetest.SpanID(key, fmt.Sprint("s", rng.IntN(60))))
						ps.SetStartTimestamp(pcommon.Timestamp(rng.Int64N(1000)))
						ps.SetEndTimestamp(pcommon.Timestamp(rng.Int64N(1000)))
						for range rng.IntN(30) {
							ps.Attributes().PutStr(fmt.Sprint("a", rng.IntN(50)), "value of some length")
						}
					}
				}
				s.Add(td)
				checkAccounting(t, s)
				s.Requests(3, rng.IntN(3))
			}
			st := s.Stats()
			t.Logf("%+v", st)
			if st.EvictedTraces == 0 || st.DuplicateSpans == 0 {
				t.Fatalf("the traffic did not exercise eviction and retries: %+v", st)
			}
		})
	}
}
