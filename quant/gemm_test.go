package quant

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

// TestGemm checks the integer GEMM of every type at every level against
// DotQ8K or DotQ80 of each pair of rows (the same integer arithmetic, one
// row at a time): full and partial tiles and panels, accumulation,
// outliers and zero blocks.
func TestGemm(t *testing.T) {
	atEachLevel(t, func(t *testing.T) {
		for _, typ := range []Type{Q4_K, Q6_K, Q8_0, Q5_0, Q4_0} {
			t.Run(typ.String(), func(t *testing.T) { testGemm(t, typ) })
		}
	})
}

func testGemm(t *testing.T, typ Type) {
	r := rand.New(rand.NewPCG(11, 12))
	for _, tc := range []struct {
		name       string
		m, n, k    int
		acc        bool
		x          func(n int) []float32
		zeroBlocks bool
		blocks32   bool // k not a multiple of 256: the 32-element formats only
		dirty      bool // c holds NaNs before a product that overwrites it
	}{
		{name: "overwrite", m: 12, n: 64, k: 256, dirty: true, x: func(n int) []float32 { return gauss(r, n, 1) }},
		{name: "one tile one panel", m: 6, n: 32, k: 256, x: func(n int) []float32 { return gauss(r, n, 1) }},
		{name: "partial tile", m: 4, n: 32, k: 512, x: func(n int) []float32 { return gauss(r, n, 0.3) }},
		{name: "partial panel", m: 13, n: 7, k: 768, x: func(n int) []float32 { return gauss(r, n, 1) }},
		{name: "accumulate", m: 9, n: 40, k: 512, acc: true, x: func(n int) []float32 { return gauss(r, n, 1) }},
		{name: "outliers", m: 6, n: 32, k: 2048, x: func(n int) []float32 { return gaussOutliers(r, n, 1) }},
		{name: "zero blocks", m: 7, n: 33, k: 512, zeroBlocks: true, x: func(n int) []float32 { return gauss(r, n, 1) }},
		{name: "224 columns", m: 8, n: 35, k: 224, blocks32: true, x: func(n int) []float32 { return gauss(r, n, 1) }},
		{name: "2,560 columns", m: 7, n: 33, k: 2560, x: func(n int) []float32 { return gaussOutliers(r, n, 1) }}, // 80 Q8_0 blocks: two groups of QuantizeTile
	} {
		if tc.blocks32 && !SupportsQ80(typ) {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			w := make([][]byte, tc.n)
			for j := range w {
				w[j] = randomRow(r, typ, tc.k)
			}
			a := make([][]float32, tc.m)
			for i := range a {
				a[i] = tc.x(tc.k)
				if tc.zeroBlocks && i%2 == 0 {
					clear(a[i][:QK_K])
					clear(a[i][QK_K+32 : QK_K+64])
				}
			}
			var x GemmTiles
			if err := x.Reset(typ, tc.m, tc.k); err != nil {
				t.Fatal(err)
			}
			for ti := range x.Tiles() {
				if err := x.QuantizeTile(ti, a[ti*GemmTileRows:min(tc.m, (ti+1)*GemmTileRows)]...); err != nil {
					t.Fatal(err)
				}
			}
			c := make([]float32, tc.m*tc.n)
			base := make([]float32, len(c))
			if tc.acc {
				for i := range base {
					base[i] = float32(r.NormFloat64())
				}
				copy(c, base)
			} else if tc.dirty {
				for i := range c {
					c[i] = float32(math.NaN())
				}
			}
			var p GemmPanel
			for j0 := 0; j0 < tc.n; j0 += GemmPanelRows {
				j1 := min(tc.n, j0+GemmPanelRows)
				if err := p.Pack(typ, w[j0:j1], tc.k); err != nil {
					t.Fatal(err)
				}
				for ti := range x.Tiles() {
					i0 := ti * GemmTileRows
					Gemm(&p, &x, ti, min(GemmTileRows, tc.m-i0), c[i0*tc.n+j0:], tc.n, tc.acc)
				}
			}
			// No call allocates, a partial tile's included (its buffer
			// once moved to the heap: a prefill's largest garbage).
			ti := x.Tiles() - 1
			i0, j0 := ti*GemmTileRows, (tc.n-1)/GemmPanelRows*GemmPanelRows
			scratch := make([]float32, len(c))
			if n := testing.AllocsPerRun(5, func() { Gemm(&p, &x, ti, min(GemmTileRows, tc.m-i0), scratch[i0*tc.n+j0:], tc.n, true) }); n != 0 {
				t.Errorf("Gemm: %v allocations per call", n)
			}
			for i := range tc.m {
				dot := rowDot(t, typ, a[i])
				for j := range tc.n {
					want := float64(base[i*tc.n+j]) + float64(dot(w[j]))
					var mag float64
					for e := range tc.k {
						mag += math.Abs(float64(refElem(typ, w[j], e)) * float64(a[i][e]))
					}
					if got := float64(c[i*tc.n+j]); !(math.Abs(got-want) <= 1e-5*(mag+1)) { // a NaN fails too
						t.Fatalf("c[%d][%d] = %g, want %g (Σ|terms| %g)", i, j, got, want, mag)
					}
				}
			}
		})
	}
}

// rowDot is the one-row integer dot of a with rows of type typ.
func rowDot(t *testing.T, typ Type, a []float32) func(w []byte) float32 {
	if SupportsQ80(typ) {
		var q Q80
		if err := q.Quantize(a); err != nil {
			t.Fatal(err)
		}
		return func(w []byte) float32 { return DotQ80(typ, w, &q) }
	}
	var q Q8K
	if err := q.Quantize(a); err != nil {
		t.Fatal(err)
	}
	return func(w []byte) float32 { return DotQ8K(typ, w, &q) }
}

func TestGemmErrors(t *testing.T) {
	var p GemmPanel
	var x GemmTiles
	row := randomRow(rand.New(rand.NewPCG(1, 2)), Q4_K, 256)
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"panel k not a multiple of 256", p.Pack(Q4_K, [][]byte{row}, 100)},
		{"panel of no rows", p.Pack(Q4_K, nil, 256)},
		{"panel of 33 rows", p.Pack(Q4_K, make([][]byte, 33), 256)},
		{"panel row too short", p.Pack(Q4_K, [][]byte{row[:100]}, 256)},
		{"Q6_K row given as Q4_K", p.Pack(Q4_K, [][]byte{randomRow(rand.New(rand.NewPCG(1, 2)), Q6_K, 256)}, 256)},
		{"tiles k 0", x.Reset(Q4_K, 4, 0)},
		{"tiles of no rows", x.Reset(Q4_K, 0, 256)},
	} {
		if !errors.Is(tc.err, ErrSize) {
			t.Errorf("%s: error %v, want ErrSize", tc.name, tc.err)
		}
	}
	if err := p.Pack(Q4_1, [][]byte{make([]byte, 20*8)}, 256); !errors.Is(err, ErrUnsupported) {
		t.Errorf("Q4_1 panel: error %v, want ErrUnsupported", err)
	}
	if err := x.Reset(F16, 6, 256); !errors.Is(err, ErrUnsupported) {
		t.Errorf("F16 tiles: error %v, want ErrUnsupported", err)
	}
	if err := x.Reset(Q4_K, 7, 256); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		t    int
		rows [][]float32
	}{
		{"tile out of range", 2, nil},
		{"negative tile", -1, nil},
		{"too many rows", 0, make([][]float32, 7)},
		{"short row", 0, [][]float32{make([]float32, 255)}},
	} {
		if err := x.QuantizeTile(tc.t, tc.rows...); !errors.Is(err, ErrSize) {
			t.Errorf("%s: error %v, want ErrSize", tc.name, err)
		}
	}
}

// BenchmarkGemm is the integer GEMM's tile kernel on one core: a
// 2,048-column panel of 32 rows against 64 tiles of 6 rows (the panel
// from L2, the tiles from L2/L3, as in a prefill); ns per weight·row.
func BenchmarkGemm(b *testing.B) {
	for _, typ := range []Type{Q4_K, Q6_K, Q8_0} {
		b.Run(typ.String(), func(b *testing.B) { benchGemm(b, typ) })
	}
}

func benchGemm(b *testing.B, typ Type) {
	const k, m = 2048, 64 * GemmTileRows
	r := rand.New(rand.NewPCG(3, 4))
	w := make([][]byte, GemmPanelRows)
	for j := range w {
		w[j] = randomRow(r, typ, k)
	}
	var p GemmPanel
	if err := p.Pack(typ, w, k); err != nil {
		b.Fatal(err)
	}
	var x GemmTiles
	if err := x.Reset(typ, m, k); err != nil {
		b.Fatal(err)
	}
	for ti := range x.Tiles() {
		rows := make([][]float32, GemmTileRows)
		for i := range rows {
			rows[i] = gauss(r, k, 1)
		}
		if err := x.QuantizeTile(ti, rows...); err != nil {
			b.Fatal(err)
		}
	}
	c := make([]float32, m*GemmPanelRows)
	b.ReportAllocs()
	b.SetBytes(int64(k * GemmPanelRows * m))
	for b.Loop() {
		for ti := range x.Tiles() {
			Gemm(&p, &x, ti, GemmTileRows, c[ti*GemmTileRows*GemmPanelRows:], GemmPanelRows, false)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(k*GemmPanelRows*m), "ns/weight·row")
}

// BenchmarkGemmPack is unpacking a panel of 32 rows of 2,048 weights; ns
// per weight (against BenchmarkGemm's ns per weight·row: the packing is
// paid once per panel and call, the product once per row).
func BenchmarkGemmPack(b *testing.B) {
	for _, typ := range []Type{Q4_K, Q6_K, Q8_0, Q5_0} {
		b.Run(typ.String(), func(b *testing.B) {
			const k = 2048
			r := rand.New(rand.NewPCG(3, 4))
			w := make([][]byte, GemmPanelRows)
			for j := range w {
				w[j] = randomRow(r, typ, k)
			}
			var p GemmPanel
			b.ReportAllocs()
			for b.Loop() {
				if err := p.Pack(typ, w, k); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(k*GemmPanelRows), "ns/weight")
		})
	}
}

// TestGemmSharedTiles: one quantization of the activations serves panels
// of every type that fits it (a mixed Q4_K|Q6_K or Q8_0|Q5_0|Q4_0 stack),
// at every level, checked against the one-row integer dots; Fits says
// which.
func TestGemmSharedTiles(t *testing.T) {
	atEachLevel(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(21, 22))
		const m, n, k = 8, 40, 512
		for _, tc := range []struct {
			reset  Type
			panels []Type
		}{
			{Q6_K, []Type{Q4_K, Q6_K}},
			{Q4_0, []Type{Q8_0, Q5_0, Q4_0}},
		} {
			a := make([][]float32, m)
			for i := range a {
				a[i] = gauss(r, k, 1)
			}
			var x GemmTiles
			if err := x.Reset(tc.reset, m, k); err != nil {
				t.Fatal(err)
			}
			for ti := range x.Tiles() {
				if err := x.QuantizeTile(ti, a[ti*GemmTileRows:min(m, (ti+1)*GemmTileRows)]...); err != nil {
					t.Fatal(err)
				}
			}
			for _, typ := range []Type{Q4_K, Q6_K, Q8_0, Q5_0, Q4_0} {
				if want := SupportsQ8K(typ) == SupportsQ8K(tc.reset); x.Fits(typ) != want {
					t.Errorf("tiles for %s: Fits(%s) = %v, want %v", tc.reset, typ, !want, want)
				}
			}
			for _, typ := range tc.panels {
				w := make([][]byte, n)
				for j := range w {
					w[j] = randomRow(r, typ, k)
				}
				c := make([]float32, m*n)
				var p GemmPanel
				for j0 := 0; j0 < n; j0 += GemmPanelRows {
					if err := p.Pack(typ, w[j0:min(n, j0+GemmPanelRows)], k); err != nil {
						t.Fatal(err)
					}
					for ti := range x.Tiles() {
						i0 := ti * GemmTileRows
						Gemm(&p, &x, ti, min(GemmTileRows, m-i0), c[i0*n+j0:], n, false)
					}
				}
				for i := range m {
					dot := rowDot(t, typ, a[i])
					for j := range n {
						want := float64(dot(w[j]))
						if got := float64(c[i*n+j]); math.Abs(got-want) > 1e-4*(math.Abs(want)+1) {
							t.Fatalf("tiles for %s, %s panel: c[%d][%d] = %g, want %g", tc.reset, typ, i, j, got, want)
						}
					}
				}
			}
		}
	})
}

// BenchmarkGemmQuantizeTile is quantizing one tile of six 2,048-value
// activation rows for the integer GEMM (Q8_K tiles for the K-quants, Q8_0
// tiles for the 32-element formats); ns per value.
func BenchmarkGemmQuantizeTile(b *testing.B) {
	r := rand.New(rand.NewPCG(5, 6))
	const k = 2048
	rows := make([][]float32, GemmTileRows)
	for i := range rows {
		rows[i] = gaussOutliers(r, k, 1)
	}
	for _, typ := range []Type{Q4_K, Q8_0} {
		b.Run(typ.String(), func(b *testing.B) {
			var x GemmTiles
			if err := x.Reset(typ, GemmTileRows, k); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if err := x.QuantizeTile(0, rows...); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(k*GemmTileRows), "ns/value")
		})
	}
}
