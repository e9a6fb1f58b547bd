package blend

import (
	"testing"

	"github.com/cacheblend/cacheblend/rpc"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
)

// FuzzCheckMatch feeds arbitrary Retrieve matches (outside input) to the
// conversion and validation that cut them into per-chunk segments: it never panics, and
// an accepted match yields contiguous segments inside their chunks that
// cover exactly the current range.
func FuzzCheckMatch(f *testing.F) {
	f.Add(int32(0), int32(300), int32(700), int32(1000), int32(0), uint8(2), false, uint16(256))
	f.Add(int32(256), int32(300), int32(956), int32(1000), int32(256), uint8(1), false, uint16(256))
	f.Add(int32(0), int32(512), int32(0), int32(512), int32(0), uint8(2), true, uint16(256))
	f.Add(int32(5), int32(3), int32(1), int32(-1), int32(9), uint8(0), true, uint16(1))
	f.Fuzz(func(t *testing.T, ss, se, cs, ce, fcs int32, nkeys uint8, prefix bool, chunk uint16) {
		if chunk == 0 {
			return
		}
		keys := make([][]byte, nkeys)
		for i := range keys {
			keys[i] = make([]byte, 32)
		}
		m := &cbv1.Match{StoredSt: ss, StoredEd: se, CurSt: cs, CurEd: ce, FirstChunkStart: fcs, ChunkKeys: keys, Prefix: prefix}
		pm, err := rpc.MatchFromProto(m)
		if err != nil || pm.Validate(int(chunk), MaxTokens) != nil {
			return
		}
		next := int(cs)
		total := 0
		for _, sg := range pm.Segments(int(chunk)) {
			if sg.Cur.Start != next || sg.Cur.Len() <= 0 || sg.ChunkOff < 0 || sg.ChunkOff+sg.Cur.Len() > int(chunk) || sg.Shift == prefix {
				t.Fatalf("bad segment %+v of %v", sg, m)
			}
			next = sg.Cur.End
			total += sg.Cur.Len()
		}
		if total != int(ce-cs) {
			t.Fatalf("segments cover %d tokens, match %d", total, ce-cs)
		}
	})
}
