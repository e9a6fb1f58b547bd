package quant

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestBlockQuantizers checks the block quantizers of the activations
// (q8kBlock for Q8_K, q80Block and Q80.Quantize for Q8_0), which run in
// assembly at the AVX-512 level, against their Go forms bit for bit:
// random blocks of several scales, ties of +max and −max (the first wins
// Q8_K's sign), the maximum at every lane, zeros, negative zeros,
// subnormals and values near the overflow of 127/max, and blocks with an
// Inf or NaN (which the assembly leaves to Go).
func TestBlockQuantizers(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	type block struct {
		name string
		v    []float32
	}
	var blocks []block
	for _, sd := range []float64{1e-30, 1e-3, 1, 1e4, 1e30} {
		for i := range 20 {
			blocks = append(blocks, block{fmt.Sprintf("gauss%g/%d", sd, i), gaussOutliers(r, QK_K, sd)})
		}
	}
	for lane := 0; lane < QK_K; lane += 37 {
		v := gauss(r, QK_K, 1)
		v[lane] = 9
		v[(lane+100)%QK_K] = -9 // a tie of magnitude: the first is the max
		blocks = append(blocks, block{fmt.Sprintf("tie/%d", lane), v})
		w := append([]float32(nil), v...)
		w[lane] = -9
		w[(lane+100)%QK_K] = 9
		blocks = append(blocks, block{fmt.Sprintf("tie-neg/%d", lane), w})
	}
	zero := make([]float32, QK_K)
	negZero := make([]float32, QK_K)
	for i := range negZero {
		negZero[i] = float32(math.Copysign(0, -1))
	}
	sub := make([]float32, QK_K)
	for i := range sub {
		sub[i] = math.Float32frombits(uint32(1 + i)) // subnormals
	}
	nearTiny := gauss(r, QK_K, 1e-36)
	inf, nan := gauss(r, QK_K, 1), gauss(r, QK_K, 1)
	inf[77] = float32(math.Inf(-1))
	nan[200] = float32(math.NaN())
	blocks = append(blocks, block{"zero", zero}, block{"negzero", negZero}, block{"subnormal", sub},
		block{"near-overflow", nearTiny}, block{"inf", inf}, block{"nan", nan})
	atEachLevel(t, func(t *testing.T) {
		for _, b := range blocks {
			t.Run(b.name, func(t *testing.T) {
				var got, want [QK_K]int8
				gd, wd := q8kBlock(b.v, &got), q8kBlockGo(b.v, &want)
				if math.Float32bits(gd) != math.Float32bits(wd) || got != want {
					t.Fatalf("q8kBlock: d %g, want %g; q %v, want %v", gd, wd, got[:16], want[:16])
				}
				var x Q80
				if err := x.Quantize(b.v); err != nil {
					t.Fatal(err)
				}
				for blk := range QK_K / QK8_0 {
					var w [QK8_0]int8
					wd := q80BlockGo(b.v[blk*QK8_0:(blk+1)*QK8_0], w[:])
					var one [QK8_0]int8
					od := q80Block(b.v[blk*QK8_0:(blk+1)*QK8_0], one[:])
					if math.Float32bits(x.d[blk]) != math.Float32bits(wd) || math.Float32bits(od) != math.Float32bits(wd) ||
						[QK8_0]int8(x.q[blk*QK8_0:]) != w || one != w {
						t.Fatalf("block %d: Quantize d %g, q80Block d %g, want %g", blk, x.d[blk], od, wd)
					}
				}
			})
		}
	})
}

// BenchmarkQuantizeActivations is the quantization of a 2,048-wide
// activation row to Q8_K and to Q8_0 (ns/value).
func BenchmarkQuantizeActivations(b *testing.B) {
	v := gaussOutliers(rand.New(rand.NewPCG(33, 34)), 2048, 1)
	var k Q8K
	var z Q80
	for _, c := range []struct {
		name string
		fn   func() error
	}{{"Q8_K", func() error { return k.Quantize(v) }}, {"Q8_0", func() error { return z.Quantize(v) }}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := c.fn(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(v)), "ns/value")
		})
	}
}

// TestQuantizeF16 checks Quantize(F16), in assembly at the AVX2 and
// AVX-512 levels with a Go tail, against F32ToF16 value by value: every
// length from 0 to 40 (the tails), random values of many magnitudes,
// ties to even, overflow to Inf, values that become subnormal or zero,
// signed zeros and infinities.
func TestQuantizeF16(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 42))
	var vals []float32
	for _, sd := range []float64{1e-9, 1e-6, 1e-3, 1, 1e3, 6e4, 1e6} {
		vals = append(vals, gauss(r, 64, sd)...)
	}
	for m := range uint32(32) { // 1 + m·2⁻¹¹: halfway cases and their neighbours
		vals = append(vals, math.Float32frombits(0x3f800000+m<<12), math.Float32frombits(0x3f800000+m<<12+1))
	}
	vals = append(vals, 65504, 65520, 65519.99, -70000, 5.96e-8, 2.98e-8, 2.99e-8, 1e-10,
		float32(math.Copysign(0, -1)), 0, float32(math.Inf(1)), float32(math.Inf(-1)))
	atEachLevel(t, func(t *testing.T) {
		for n := range 41 {
			src := vals[len(vals)-n:]
			got := make([]byte, 2*n)
			if err := Quantize(F16, src, got); err != nil {
				t.Fatal(err)
			}
			for i, v := range src {
				if h, want := le16(got[2*i:]), F32ToF16(v); h != want {
					t.Fatalf("n=%d: %g → %#04x, want %#04x", n, v, h, want)
				}
			}
		}
		got := make([]byte, 2*len(vals))
		if err := Quantize(F16, vals, got); err != nil {
			t.Fatal(err)
		}
		for i, v := range vals {
			if h, want := le16(got[2*i:]), F32ToF16(v); h != want {
				t.Fatalf("value %d: %g → %#04x, want %#04x", i, v, h, want)
			}
		}
	})
}
