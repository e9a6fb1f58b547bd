package model

import (
	"fmt"
	"math"
	"testing"

	"github.com/cacheblend/cacheblend/quant"
)

// TestQgemmPaths checks every path of qgemm (fused dots, per-row dots,
// dequantized panels) on every shape of batch against a float64 product of
// the dequantized weight with the activations llama.cpp would multiply
// (rounded per actround.go), for uniform and mixed-type weights, with and
// without accumulation, at a column offset.
func TestQgemmPaths(t *testing.T) {
	for _, n := range []int{70, 1100} {
		t.Run(fmt.Sprintf("n%d", n), func(t *testing.T) { testQgemmPaths(t, n, 512) })
	}
	// Wide half-precision rows (a down projection's): the tiles for a
	// few activation rows, the one-row kernel for one.
	t.Run(fmt.Sprintf("n70/k%d", wideK), func(t *testing.T) { testQgemmPaths(t, 70, wideK) })
}

// wideK is the width of TestQgemmPaths's wide half-precision rows.
const wideK = 4096

// testQgemmPaths is TestQgemmPaths on n weight rows of k columns (1,100
// rows: tasks of several panels and spans of rows, see dotChunk); from
// wideK columns on F16 and BF16 weights only.
func testQgemmPaths(t *testing.T, n, k int) {
	w := randMat(7, n*k)
	build := func(t *testing.T, perm bool, types ...quant.Type) *qmat {
		var parts []*qmat
		per := n / len(types)
		for i, typ := range types {
			r1 := (i + 1) * per
			if i == len(types)-1 {
				r1 = n
			}
			data, err := quant.QuantizeRows(typ, w[i*per*k:r1*k], k)
			if err != nil {
				t.Fatal(err)
			}
			q, err := newQmat(typ, k, r1-i*per, data)
			if err != nil {
				t.Fatal(err)
			}
			parts = append(parts, q)
		}
		if perm { // a llama file's Q or K: five heads of n/5 rows
			p, err := parts[0].unpermute(5, n/5)
			if err != nil {
				t.Fatal(err)
			}
			parts[0] = p
		}
		q, err := stack(parts...)
		if err != nil {
			t.Fatal(err)
		}
		if perm && q.pairRows != n/5 {
			t.Fatalf("unpermuted weight: pairRows %d, want %d", q.pairRows, n/5)
		}
		return q
	}
	weights := []struct {
		name  string
		types []quant.Type
		perm  bool // one type's rows as unpermuted heads
	}{
		{"F16", []quant.Type{quant.F16}, false},
		{"F16 unpermuted", []quant.Type{quant.F16}, true},
		{"Q8_0 unpermuted", []quant.Type{quant.Q8_0}, true},
		{"Q4_K unpermuted", []quant.Type{quant.Q4_K}, true},
		{"Q8_0", []quant.Type{quant.Q8_0}, false},
		{"Q4_K", []quant.Type{quant.Q4_K}, false},
		{"Q6_K", []quant.Type{quant.Q6_K}, false},
		{"Q4_K|Q6_K|Q4_K mixed", []quant.Type{quant.Q4_K, quant.Q6_K, quant.Q4_K}, false},
		{"Q8_0|F16 mixed", []quant.Type{quant.Q8_0, quant.F16}, false},
		{"Q5_0", []quant.Type{quant.Q5_0}, false},
		{"Q4_0", []quant.Type{quant.Q4_0}, false},
		{"Q5_0|Q8_0|Q6_K mixed", []quant.Type{quant.Q5_0, quant.Q8_0, quant.Q6_K}, false},
	}
	if k >= wideK {
		weights = []struct {
			name  string
			types []quant.Type
			perm  bool
		}{{"F16", []quant.Type{quant.F16}, false}, {"BF16", []quant.Type{quant.BF16}, false}, {"F16 unpermuted", []quant.Type{quant.F16}, true}}
	}
	for _, wc := range weights {
		ms := []int{1, qDotRows, qDotRows + 1, 8, qRowDots, qRowDots + 1, 100}
		if n > 100 || k >= wideK {
			ms = []int{1, 3, qRowDots}
		}
		for _, m := range ms {
			for _, acc := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/m%d/acc=%v", wc.name, m, acc), func(t *testing.T) {
					q := build(t, wc.perm, wc.types...)
					if len(wc.types) > 1 && !q.mixed {
						t.Fatal("mixed weight lost its row types")
					}
					a := randMat(uint64(m), m*k)
					// Some of the rows, and all of them (a mixed weight's
					// cached runs of one type, typeRuns).
					for _, span := range [][2]int{{3, n - 5}, {0, n}} {
						off, cols := span[0], span[1]
						c := make([]float32, m*cols)
						for i := range c {
							c[i] = float32(i%7) - 3
						}
						before := append([]float32(nil), c...)
						qgemm(newTeam(2), dense(c, m, cols), dense(a, m, k), q, off, acc)
						row := make([]float32, k)
						x := make([]float32, k)
						for j := range cols {
							q.row(off+j, row)
							for i := range m {
								copy(x, a[i*k:(i+1)*k])
								roundRow(activationRounding(q.typeAt(off+j)), x)
								var want float64
								for p := range k {
									want += float64(row[p]) * float64(x[p])
								}
								if acc {
									want += float64(before[i*cols+j])
								}
								got := float64(c[i*cols+j])
								if math.Abs(got-want) > 1e-4*(1+math.Abs(want)) {
									t.Fatalf("c[%d][%d] = %g, want %g", i, j, got, want)
								}
							}
						}
					}
				})
			}
		}
	}
}
