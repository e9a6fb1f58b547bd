//go:build amd64 && !noasm

package quant

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/cacheblend/cacheblend/simd"
)

// TestAsmMatchesGo compares every assembly dot kernel (AVX2, and AVX-512
// where the CPU has it) with its pure-Go fallback on random rows (sane and
// arbitrary block bytes, quantized data, tiny activations) of many
// lengths: equal up to float32 summation order.
func TestAsmMatchesGo(t *testing.T) {
	if !hasAVX2 {
		t.Fatal("this amd64 CPU lacks AVX2/FMA/F16C: the assembly cannot be tested here")
	}
	prev := simd.Current()
	defer simd.SetLevel(prev)
	levels := []simd.Level{simd.AVX2}
	if simd.Supported(simd.AVX512) {
		levels = append(levels, simd.AVX512)
	}
	for _, l := range levels {
		if _, err := simd.SetLevel(l); err != nil {
			t.Fatal(err)
		}
		t.Run(asmLevel(), testAsmMatchesGo)
	}
}

func testAsmMatchesGo(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	for _, typ := range allTypes {
		if typ == F32 {
			continue
		}
		t.Run(typ.String(), func(t *testing.T) {
			k := kern[typ]
			bs := typ.BlockSize()
			for _, nb := range []int{1, 2, 3, 4, 5, 7, 8, 9, 33, 64} {
				n := nb * max(bs, 16)
				if bs == 1 && nb%2 == 1 {
					n += nb % 16 // a tail for the pure-Go remainder
				}
				for c := range 6 {
					row := randomRow(r, typ, n)
					switch c {
					case 1: // arbitrary bytes, scales kept finite
						raw := randomRow(r, typ, n)
						for i := range raw {
							raw[i] = byte(r.Uint32())
						}
						row = fixScales(typ, raw, row)
					case 2:
						if err := Quantize(typ, gaussOutliers(r, n, 3), row); err != nil {
							t.Fatal(err)
						}
					}
					x := gauss(r, n, 1)
					if c == 3 {
						for i := range x {
							x[i] *= 1e-20
						}
					}
					got, want := k.dot(row, x), k.dotGo(row, x)
					var mag float64
					w := make([]float32, n)
					if err := DequantizeRow(typ, row, w); err != nil {
						t.Fatal(err)
					}
					for i := range w {
						mag += math.Abs(float64(w[i]) * float64(x[i]))
					}
					if math.Abs(float64(got)-float64(want)) > 2e-5*mag+1e-35 {
						t.Fatalf("n=%d case %d: asm %v, Go %v (Σ|wx| %g)", n, c, got, want, mag)
					}
				}
			}
		})
	}
}

// fixScales copies the f16 scale fields of sane into raw (so arbitrary
// quant bits keep finite values).
func fixScales(typ Type, raw, sane []byte) []byte {
	ts := typ.TypeSize()
	offs := scaleOffsets[typ]
	if offs == nil { // float types: take the sane row
		return sane
	}
	for b := 0; b < len(raw)/ts; b++ {
		for _, o := range offs {
			copy(raw[b*ts+o:b*ts+o+2], sane[b*ts+o:])
		}
	}
	return raw
}
