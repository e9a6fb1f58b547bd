package model

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"unsafe"

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
	for _, pr := range []struct {
		name string
		q    *qmat
		want int
	}{{"tensor", a, 0}, {"unpermuted", perm, 4}, {"unpermuted, stacked", permAB, 4}, {"columns", cols, 0}} {
		if pr.q.pairRows != pr.want {
			t.Errorf("%s: pairRows %d, want %d", pr.name, pr.q.pairRows, pr.want)
		}
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
				for r1 := r0; r1 <= tt.q.n; r1++ {
					checkStorageOrder(t, tt.q, q.rows, r0, r1)
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

// checkStorageOrder checks q.storageRowsInto(r0, r1) against the rows in
// logical order: every row once, at its index; the headers in ascending
// memory order within each wholly covered interleaved pair of spans (so
// ascending over a whole unpermuted tensor); inOrder exactly when no row
// moved.
func checkStorageOrder(t *testing.T, q *qmat, rows [][]byte, r0, r1 int) {
	t.Helper()
	ws, idx, inOrder := q.storageRowsInto(nil, nil, r0, r1)
	if len(ws) != r1-r0 || (inOrder && len(idx) != 0) || (!inOrder && len(idx) != r1-r0) {
		t.Fatalf("storageRowsInto(%d, %d): %d headers, %d indices, inOrder %v", r0, r1, len(ws), len(idx), inOrder)
	}
	seen := make([]bool, r1-r0)
	moved := false
	for i, row := range ws {
		j := i
		if !inOrder {
			j = int(idx[i])
		}
		if j < 0 || j >= r1-r0 || seen[j] {
			t.Fatalf("storageRowsInto(%d, %d): index %d = %d repeated or out of range", r0, r1, i, j)
		}
		seen[j] = true
		moved = moved || j != i
		if !bytes.Equal(row, rows[r0+j]) || len(row) != cap(row) {
			t.Fatalf("storageRowsInto(%d, %d) header %d (row %d) = %v, want %v", r0, r1, i, r0+j, row, rows[r0+j])
		}
	}
	if inOrder == moved {
		t.Fatalf("storageRowsInto(%d, %d): inOrder %v, rows moved %v", r0, r1, inOrder, moved)
	}
	for s := range q.spans {
		sp := &q.spans[s]
		if s+1 == len(q.spans) || !interleaved(sp, &q.spans[s+1]) || sp.first < r0 || sp.first+2*sp.n > r1 {
			continue
		}
		i0 := sp.first - r0
		for i := i0 + 1; i < i0+2*sp.n; i++ {
			if uintptr(unsafe.Pointer(unsafe.SliceData(ws[i]))) <= uintptr(unsafe.Pointer(unsafe.SliceData(ws[i-1]))) {
				t.Fatalf("storageRowsInto(%d, %d): header %d not after header %d in memory", r0, r1, i, i-1)
			}
		}
	}
}

// TestManyRowsStorageOrder: a one-row product over unpermuted F16 heads
// stacked with a plain tensor (a llama file's Q|K|V), over every column
// range a view takes and with and without accumulation, equals each
// row's own one-row kernel call, bit for bit, at one and two threads.
func TestManyRowsStorageOrder(t *testing.T) {
	const in, heads, hd = 64, 5, 24
	r := rand.New(rand.NewPCG(3, 4))
	f16 := func(out int) *qmat {
		rb, _ := quant.F16.RowBytes(in)
		data := make([]byte, rb*out)
		for i := 0; i < len(data); i += 2 {
			h := quant.F32ToF16(float32(r.NormFloat64()))
			data[i], data[i+1] = byte(h), byte(h>>8)
		}
		q, err := newQmat(quant.F16, in, out, data)
		if err != nil {
			t.Fatal(err)
		}
		return q
	}
	perm, err := f16(heads*hd).unpermute(heads, hd)
	if err != nil {
		t.Fatal(err)
	}
	q, err := stack(perm, f16(40))
	if err != nil {
		t.Fatal(err)
	}
	x := make([]float32, in)
	for i := range x {
		x[i] = quant.F16ToF32(quant.F32ToF16(float32(r.NormFloat64())))
	}
	want := make([]float32, q.n)
	for j := range want {
		quant.DotMany(quant.F16, [][]byte{q.rowAt(j)}, x, want[j:j+1])
	}
	for _, threads := range []int{1, 2} {
		tm := newTeam(threads)
		for _, rg := range []struct{ off, n int }{{0, q.n}, {0, heads * hd}, {hd, 2 * hd}, {7, 100}, {heads * hd, 40}} {
			for _, acc := range []bool{false, true} {
				c := make([]float32, rg.n)
				for j := range c {
					c[j] = float32(j)
				}
				manyRows(tm, dense(c, 1, rg.n), q, rg.off, acc, func(ws [][]byte, out []float32) { quant.DotMany(quant.F16, ws, x, out) })
				for j, v := range c {
					w := want[rg.off+j]
					if acc {
						w += float32(j)
					}
					if v != w {
						t.Fatalf("%d threads, rows [%d, %d), acc %v: column %d = %g, want %g", threads, rg.off, rg.off+rg.n, acc, j, v, w)
					}
				}
			}
		}
	}
}
