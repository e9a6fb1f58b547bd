package model

import (
	"bytes"
	"testing"

	"github.com/cacheblend/cacheblend/quant"
)

// TestRowSpans checks the spans of a qmat after the operations that build
// the model's weights (stack, sliceRows, sliceCols, unpermute) against the
// rows cut one by one from the tensors' bytes.
func TestRowSpans(t *testing.T) {
	const in = 64 // two Q8_0 blocks, a quarter of a Q4_K row
	tensor := func(tt quant.Type, out int, seed byte) (*qmat, [][]byte) {
		rb, _ := tt.RowBytes(in)
		data := make([]byte, rb*out)
		for i := range data {
			data[i] = byte(i)*7 + seed
		}
		q, err := newQmat(tt, in, out, data)
		if err != nil {
			t.Fatal(err)
		}
		var rows [][]byte
		for r := range out {
			rows = append(rows, data[r*rb:(r+1)*rb])
		}
		return q, rows
	}
	a, ra := tensor(quant.Q8_0, 12, 1)
	b, rb := tensor(quant.Q8_0, 5, 2)
	c, rc := tensor(quant.F16, 3, 3)
	type want struct {
		rows  [][]byte
		types []quant.Type
	}
	types := func(t quant.Type, n int) []quant.Type {
		out := make([]quant.Type, n)
		for i := range out {
			out[i] = t
		}
		return out
	}
	cat := func(xs ...[][]byte) [][]byte {
		var out [][]byte
		for _, x := range xs {
			out = append(out, x...)
		}
		return out
	}
	abc, err := stack(a, b, c)
	if err != nil {
		t.Fatal(err)
	}
	perm, err := a.unpermute(3, 4)
	if err != nil {
		t.Fatal(err)
	}
	permAB, err := stack(perm, b)
	if err != nil {
		t.Fatal(err)
	}
	cols, err := permAB.sliceCols(32, 64)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		q    *qmat
		want want
	}{
		{"tensor", a, want{ra, types(quant.Q8_0, 12)}},
		{"stack of three, mixed", abc, want{cat(ra, rb, rc), append(types(quant.Q8_0, 17), types(quant.F16, 3)...)}},
		{"rows across spans", abc.sliceRows(10, 19), want{cat(ra[10:], rb, rc[:2]), append(types(quant.Q8_0, 7), types(quant.F16, 2)...)}},
		{"unpermuted", perm, want{unpermuteRows(ra, 3, 4), types(quant.Q8_0, 12)}},
		{"unpermuted, stacked, rows", permAB.sliceRows(3, 14), want{cat(unpermuteRows(ra, 3, 4)[3:], rb[:2]), types(quant.Q8_0, 11)}},
		{"columns", cols, want{func() [][]byte {
			var out [][]byte
			for _, r := range cat(unpermuteRows(ra, 3, 4), rb) {
				out = append(out, r[34:68]) // the second Q8_0 block
			}
			return out
		}(), types(quant.Q8_0, 17)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := tt.want
			if tt.q.n != len(q.rows) {
				t.Fatalf("%d rows, want %d", tt.q.n, len(q.rows))
			}
			for r0 := range tt.q.n {
				for r1 := r0; r1 <= tt.q.n; r1++ {
					got := tt.q.rowsInto(nil, r0, r1)
					if len(got) != r1-r0 {
						t.Fatalf("rowsInto(%d, %d): %d rows", r0, r1, len(got))
					}
					for i, row := range got {
						if !bytes.Equal(row, q.rows[r0+i]) || len(row) != cap(row) {
							t.Fatalf("rowsInto(%d, %d) row %d = %v (cap %d), want %v", r0, r1, r0+i, row, cap(row), q.rows[r0+i])
						}
					}
				}
				if got := tt.q.typeAt(r0); got != q.types[r0] {
					t.Errorf("typeAt(%d) = %s, want %s", r0, got, q.types[r0])
				}
				if e := tt.q.typeRunEnd(r0, tt.q.n); e <= r0 || q.types[e-1] != q.types[r0] || e < tt.q.n && q.types[e] == q.types[r0] {
					t.Errorf("typeRunEnd(%d) = %d", r0, e)
				}
			}
		})
	}
	if _, err := abc.unpermute(3, 4); err == nil {
		t.Error("unpermute of a stack: no error")
	}
}
