package quant

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/cacheblend/cacheblend/simd"
)

// refF32ToF16 rounds f to binary16 in float64 arithmetic (ties to even),
// independently of F32ToF16's bit tricks.
func refF32ToF16(f float32) uint16 {
	bits := math.Float32bits(f)
	sign := uint16(bits>>16) & 0x8000
	a := math.Abs(float64(f))
	switch {
	case math.IsNaN(a):
		return sign | 0x7e00
	case a >= 65520: // halfway between 65504 and 2^16 rounds up to Inf
		return sign | 0x7c00
	case a < 0x1p-14: // subnormal grid of 2^-24 (may round up to 2^-14)
		return sign | uint16(math.RoundToEven(a*0x1p24))
	}
	_, e := math.Frexp(a) // a = m·2^e, m in [0.5, 1)
	ulp := math.Ldexp(1, e-11)
	n := math.RoundToEven(a / ulp) // 1024..2048
	return sign | uint16((e+13)<<10+int(n))
}

func TestF16ToF32Special(t *testing.T) {
	cases := []struct {
		name string
		h    uint16
		want float32
	}{
		{"zero", 0x0000, 0},
		{"negative zero", 0x8000, float32(math.Copysign(0, -1))},
		{"one", 0x3c00, 1},
		{"minus two", 0xc000, -2},
		{"max", 0x7bff, 65504},
		{"min normal", 0x0400, 0x1p-14},
		{"min subnormal", 0x0001, 0x1p-24},
		{"max subnormal", 0x03ff, 1023 * 0x1p-24},
		{"negative subnormal", 0x8200, -0x1p-15},
		{"inf", 0x7c00, float32(math.Inf(1))},
		{"minus inf", 0xfc00, float32(math.Inf(-1))},
		{"one third", 0x3555, 0.333251953125},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := F16ToF32(c.h); math.Float32bits(got) != math.Float32bits(c.want) {
				t.Fatalf("F16ToF32(%#04x) = %v, want %v", c.h, got, c.want)
			}
			if got := F32ToF16(c.want); got != c.h {
				t.Fatalf("F32ToF16(%v) = %#04x, want %#04x", c.want, got, c.h)
			}
		})
	}
	for _, h := range []uint16{0x7c01, 0x7e00, 0xfe00, 0x7fff, 0x7d00} {
		f := F16ToF32(h)
		if f == f {
			t.Fatalf("F16ToF32(%#04x) = %v, want NaN", h, f)
		}
		if got := F32ToF16(f); got&0x7fff != 0x7e00 || got&0x8000 != h&0x8000 {
			t.Fatalf("F32ToF16(NaN from %#04x) = %#04x, want the quiet NaN with its sign", h, got)
		}
	}
}

// TestF16AllPatterns: every non-NaN half converts to float32 and back to
// itself, and the float32 is the half's value.
func TestF16AllPatterns(t *testing.T) {
	for i := range 1 << 16 {
		h := uint16(i)
		f := F16ToF32(h)
		if h&0x7c00 == 0x7c00 && h&0x3ff != 0 {
			continue
		}
		exp, man := int(h>>10&0x1f), float64(h&0x3ff)
		want := math.Ldexp(man, -24)
		if exp > 0 {
			want = math.Ldexp(1024+man, exp-25)
		}
		if exp == 31 {
			want = math.Inf(1)
		}
		if h&0x8000 != 0 {
			want = -want
		}
		if float64(f) != want || math.Signbit(float64(f)) != (h&0x8000 != 0) {
			t.Fatalf("F16ToF32(%#04x) = %v, want %v", h, f, want)
		}
		if back := F32ToF16(f); back != h {
			t.Fatalf("F32ToF16(F16ToF32(%#04x)) = %#04x", h, back)
		}
	}
}

// TestF32ToF16Rounding compares F32ToF16 with a float64 reference at every
// tie between neighbouring halves (and one float32 ulp either side), at
// the overflow and underflow edges, and on random floats.
func TestF32ToF16Rounding(t *testing.T) {
	check := func(f float32) {
		if got, want := F32ToF16(f), refF32ToF16(f); got != want {
			t.Fatalf("F32ToF16(%v = %#08x) = %#04x, want %#04x", f, math.Float32bits(f), got, want)
		}
	}
	for i := range 0x7c00 {
		lo, hi := float64(F16ToF32(uint16(i))), float64(F16ToF32(uint16(i+1)))
		if i == 0x7bff {
			hi = 65536
		}
		mid := float32((lo + hi) / 2) // exact in float32
		for _, f := range []float32{mid, math.Nextafter32(mid, 0), math.Nextafter32(mid, 1e9)} {
			check(f)
			check(-f)
		}
	}
	for _, f := range []float32{65504, 65519.996, 65520, 65536, math.MaxFloat32, 0x1p-24, 0x1p-25, 0x1.8p-25, 0x1p-26, 0x1p-149, 0x1p-14, 0x1.ffcp-15} {
		check(f)
		check(-f)
	}
	r := rand.New(rand.NewPCG(1, 1))
	for range 1_000_000 {
		check(math.Float32frombits(r.Uint32()))
	}
}

func TestBF16(t *testing.T) {
	cases := []struct {
		name string
		f    uint32
		want uint16
	}{
		{"one", 0x3f800000, 0x3f80},
		{"tie to even down", 0x3f808000, 0x3f80},
		{"tie to even up", 0x3f818000, 0x3f82},
		{"above tie", 0x3f808001, 0x3f81},
		{"below tie", 0x3f807fff, 0x3f80},
		{"max float to inf", 0x7f7fffff, 0x7f80},
		{"inf", 0x7f800000, 0x7f80},
		{"minus inf", 0xff800000, 0xff80},
		{"signalling NaN quieted", 0x7f800001, 0x7fc0},
		{"negative NaN", 0xffc00000, 0xffc0},
		{"min subnormal to zero", 0x00000001, 0x0000},
		{"subnormal tie to even", 0x00018000, 0x0002},
		{"subnormal kept", 0x00010000, 0x0001},
		{"negative zero", 0x80000000, 0x8000},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := F32ToBF16(math.Float32frombits(c.f)); got != c.want {
				t.Fatalf("F32ToBF16(%#08x) = %#04x, want %#04x", c.f, got, c.want)
			}
		})
	}
	for i := range 1 << 16 {
		f := BF16ToF32(uint16(i))
		if math.Float32bits(f) != uint32(i)<<16 {
			t.Fatalf("BF16ToF32(%#04x) = %#08x", i, math.Float32bits(f))
		}
		if f == f && F32ToBF16(f) != uint16(i) {
			t.Fatalf("BF16 %#04x does not round-trip", i)
		}
	}
}

// TestRoundF16 compares RoundF16 with F16ToF32(F32ToF16(v)) element by
// element, at every SIMD level the CPU has, over lengths around the
// kernels' widths and RoundF16's chunk, with ties, subnormals, values
// beyond the half range, infinities and signed zeros among them.
func TestRoundF16(t *testing.T) {
	levels := []simd.Level{simd.Generic}
	for _, l := range []simd.Level{simd.AVX2, simd.AVX512} {
		if simd.Supported(l) {
			levels = append(levels, l)
		}
	}
	special := []float32{0, float32(math.Copysign(0, -1)), 1, -1, 65504, 65520, -65520, 1e6,
		float32(math.Inf(1)), float32(math.Inf(-1)), 5.96e-8, 2.98e-8, -3e-8, 1e-10,
		1 + 1.0/2048, 1 + 3.0/2048, 6.1035e-05, -6.1e-05}
	r := rand.New(rand.NewPCG(41, 42))
	for _, l := range levels {
		for _, n := range []int{0, 1, 7, 8, 15, 16, 17, 255, 256, 257, 600, 8192} {
			t.Run(fmt.Sprintf("%v/n%d", l, n), func(t *testing.T) {
				prev, err := simd.SetLevel(l)
				if err != nil {
					t.Fatal(err)
				}
				defer simd.SetLevel(prev)
				x := make([]float32, n)
				for i := range x {
					switch {
					case i%5 == 0:
						x[i] = special[(i/5)%len(special)]
					default:
						x[i] = float32(r.NormFloat64() * math.Pow(10, float64(r.IntN(12)-6)))
					}
				}
				want := make([]float32, n)
				for i, v := range x {
					want[i] = F16ToF32(F32ToF16(v))
				}
				RoundF16(x)
				for i := range x {
					if math.Float32bits(x[i]) != math.Float32bits(want[i]) {
						t.Fatalf("element %d: %v (%#08x), want %v (%#08x)", i, x[i], math.Float32bits(x[i]), want[i], math.Float32bits(want[i]))
					}
				}
			})
		}
	}
}

func BenchmarkRoundF16(b *testing.B) {
	x := gauss(rand.New(rand.NewPCG(43, 44)), 8192, 1)
	b.Run("RoundF16", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			RoundF16(x)
		}
	})
	b.Run("scalar", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			for i, v := range x {
				x[i] = F16ToF32(F32ToF16(v))
			}
		}
	})
}
