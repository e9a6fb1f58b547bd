package tracestore

import (
	"bytes"
	"math/rand/v2"
	"slices"
)

// The request index: traces kept in order of their earliest span start (a skip list, so
// that a trace is placed or moved in O(log n) and a page is read in O(offset+limit)), and
// each trace's row computed at most once per change of the trace (memoized), so that a
// call costs in proportion to the rows it returns, not to the store or to the square of a
// trace's size.

const skipMaxLevel = 24

// skipNode is one trace in the index; start and id are its key when it was placed.
type skipNode struct {
	rec   *traceRec
	start int64
	id    [16]byte
	next  []*skipNode
}

// startIndex orders traces newest first: by earliest span start, descending, then by trace
// id. Not safe for concurrent use (the store's lock guards it).
type startIndex struct {
	head  skipNode
	level int
	rng   *rand.Rand
}

func (x *startIndex) init() {
	x.head.next = make([]*skipNode, skipMaxLevel)
	x.level = 1
	x.rng = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
}

// before reports whether the key (start, id) comes before node n.
func before(start int64, id *[16]byte, n *skipNode) bool {
	if start != n.start {
		return start > n.start
	}
	return bytes.Compare(id[:], n.id[:]) < 0
}

func (x *startIndex) randomLevel() int {
	l := 1
	for l < skipMaxLevel && x.rng.Uint32()&3 == 0 { // p = 1/4
		l++
	}
	return l
}

// insert places rec by its current start; rec must not be in the index.
func (x *startIndex) insert(rec *traceRec) {
	var update [skipMaxLevel]*skipNode
	n := &skipNode{rec: rec, start: rec.start, id: rec.id}
	p := &x.head
	for l := x.level - 1; l >= 0; l-- {
		for p.next[l] != nil && before(p.next[l].start, &p.next[l].id, n) {
			p = p.next[l]
		}
		update[l] = p
	}
	lvl := x.randomLevel()
	for l := x.level; l < lvl; l++ {
		update[l] = &x.head
	}
	x.level = max(x.level, lvl)
	n.next = make([]*skipNode, lvl)
	for l := range lvl {
		n.next[l] = update[l].next[l]
		update[l].next[l] = n
	}
	rec.node = n
}

// remove takes rec out of the index (a no-op if it is not in it).
func (x *startIndex) remove(rec *traceRec) {
	n := rec.node
	if n == nil {
		return
	}
	p := &x.head
	for l := x.level - 1; l >= 0; l-- {
		for p.next[l] != nil && p.next[l] != n && before(p.next[l].start, &p.next[l].id, n) {
			p = p.next[l]
		}
		if l < len(n.next) && p.next[l] == n {
			p.next[l] = n.next[l]
		}
	}
	for x.level > 1 && x.head.next[x.level-1] == nil {
		x.level--
	}
	rec.node = nil
}

// first returns the newest trace's node, nil when empty; follow next[0].
func (x *startIndex) first() *skipNode { return x.head.next[0] }

// summaryMemo is a trace's index row as of one version of the trace.
type summaryMemo struct {
	version uint64
	row     RequestSummary
}

// rowJob is a row to return: memoized, or to compute from a snapshot of the spans.
type rowJob struct {
	rec       *traceRec
	version   uint64
	truncated bool
	spans     []*span
	memo      *summaryMemo
}

// jobLocked prepares the row of rec; the caller holds at least the read lock.
func jobLocked(rec *traceRec) rowJob {
	j := rowJob{rec: rec, version: rec.version, truncated: rec.truncated}
	if m := rec.memo.Load(); m != nil && m.version == rec.version {
		j.memo = m
	} else {
		j.spans = slices.Clone(rec.spans)
	}
	return j
}

// row returns the job's row (a copy the caller owns), computing and memoizing it if needed.
// Called without the lock: spans are immutable and the snapshot is the job's own.
func (j rowJob) row() RequestSummary {
	m := j.memo
	if m == nil {
		r := summarize(j.spans)
		r.Truncated = j.truncated
		m = &summaryMemo{version: j.version, row: r}
		for {
			cur := j.rec.memo.Load()
			if cur != nil && cur.version >= j.version {
				break
			}
			if j.rec.memo.CompareAndSwap(cur, m) {
				break
			}
		}
	}
	return m.row.clone()
}

// Requests returns a page of the request index, newest first (by root start: the earliest
// span start of each trace, then by trace id), and the number of traces in the store.
// limit 0 means all. The cost is O(offset + rows returned), plus computing the rows of
// traces that changed since they were last returned (linear in their spans, up to a sort).
func (s *Store) Requests(limit, offset int) ([]RequestSummary, int) {
	s.mu.RLock()
	total := len(s.traces)
	var jobs []rowJob
	n := s.byStart.first()
	for ; n != nil && offset > 0; n = n.next[0] {
		offset--
	}
	for ; n != nil && (limit <= 0 || len(jobs) < limit); n = n.next[0] {
		jobs = append(jobs, jobLocked(n.rec))
	}
	s.mu.RUnlock()
	out := make([]RequestSummary, 0, len(jobs))
	for _, j := range jobs {
		out = append(out, j.row())
	}
	return out, total
}

// Request returns the request-index row of one trace; false when the id is malformed or
// unknown.
func (s *Store) Request(traceID string) (RequestSummary, bool) {
	tid, ok := parseTraceID(traceID)
	if !ok {
		return RequestSummary{}, false
	}
	s.mu.RLock()
	rec := s.traces[tid]
	var j rowJob
	if rec != nil {
		j = jobLocked(rec)
	}
	s.mu.RUnlock()
	if rec == nil {
		return RequestSummary{}, false
	}
	return j.row(), true
}
