package randid

import "testing"

func TestIDsAreValidAndDistinct(t *testing.T) {
	seenT, seenS := map[[16]byte]bool{}, map[[8]byte]bool{}
	for range 1000 {
		tid, sid := TraceID(), SpanID()
		if !tid.IsValid() || !sid.IsValid() {
			t.Fatalf("invalid ids %s %s", tid, sid)
		}
		if seenT[tid] || seenS[sid] {
			t.Fatalf("repeated id %s %s", tid, sid)
		}
		seenT[tid], seenS[sid] = true, true
	}
}
