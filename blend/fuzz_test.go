package blend

import (
	"testing"

	"github.com/cacheblend/cacheblend/rpc/cbv1"
)

// FuzzCheckMatch feeds arbitrary Retrieve matches (outside input) to the
// validation that cuts them into per-chunk segments: it never panics, and
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
		segs, err := checkMatch(0, m, int(chunk))
		if err != nil {
			return
		}
		next := int(cs)
		total := 0
		for _, sg := range segs {
			if sg.curSt != next || sg.n <= 0 || sg.chunkOff < 0 || sg.chunkOff+sg.n > int(chunk) || sg.shift == prefix {
				t.Fatalf("bad segment %+v of %v", sg, m)
			}
			next += sg.n
			total += sg.n
		}
		if total != int(ce-cs) {
			t.Fatalf("segments cover %d tokens, match %d", total, ce-cs)
		}
	})
}

func TestMergeRanges(t *testing.T) {
	for _, tc := range []struct {
		name     string
		in, want []rng
	}{
		{"empty", nil, nil},
		{"drops empty", []rng{{5, 5}, {7, 3}}, nil},
		{"sorts and merges touching", []rng{{10, 20}, {0, 5}, {5, 8}}, []rng{{0, 8}, {10, 20}}},
		{"merges overlapping", []rng{{0, 10}, {3, 12}, {12, 13}}, []rng{{0, 13}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := mergeRanges(tc.in)
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("got %v, want %v", got, tc.want)
				}
			}
		})
	}
}
