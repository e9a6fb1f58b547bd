package quant

import (
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/cacheblend/cacheblend/simd"
)

func putF16(b []byte, f float32) { binary.LittleEndian.PutUint16(b, F32ToF16(f)) }

// TestKnownBlocks decodes blocks built by hand from ggml-common.h's
// layouts with values whose float32 arithmetic is exact, against values
// worked out from the layout description.
func TestKnownBlocks(t *testing.T) {
	type tc struct {
		name string
		typ  Type
		blk  func() []byte
		want func(e int) float32
	}
	// Q4_K/Q5_K scales: sub-blocks 0..3 in the low 6 bits of bytes 0..3
	// (scales) and 4..7 (mins); sub-blocks 4..7 in the nibbles of bytes
	// 8..11 with their top 2 bits in the top bits of bytes 0..7.
	sc := [8]byte{1, 17, 33, 63, 5, 40, 20, 63}
	mn := [8]byte{0, 63, 2, 48, 31, 16, 7, 50}
	packK := func(b []byte) {
		for j := range 4 {
			b[j] = sc[j] | sc[j+4]>>4<<6
			b[j+4] = mn[j] | mn[j+4]>>4<<6
			b[j+8] = sc[j+4]&15 | mn[j+4]&15<<4
		}
	}
	q4k := func(q5 bool) func() []byte {
		return func() []byte {
			n := 144
			if q5 {
				n = 176
			}
			b := make([]byte, n)
			putF16(b[0:], 0.5)  // d
			putF16(b[2:], 0.25) // dmin
			packK(b[4:16])
			qs := b[16:]
			if q5 {
				for l := range 32 {
					b[16+l] = byte(l * 37) // qh
				}
				qs = b[48:]
			}
			for i := range 128 {
				qs[i] = byte(i*7 + 3)
			}
			return b
		}
	}
	q4kWant := func(q5 bool) func(e int) float32 {
		return func(e int) float32 {
			g, w := e/64, e%64
			sb, l := 2*g+w/32, w%32
			qb := byte((32*g+l)*7 + 3)
			q := int(qb & 15)
			if w >= 32 {
				q = int(qb >> 4)
			}
			if q5 && byte(l*37)>>sb&1 == 1 {
				q += 16
			}
			return 0.5*float32(sc[sb])*float32(q) - 0.25*float32(mn[sb])
		}
	}
	cases := []tc{
		{"Q8_0 d=0.5 qs=-128..-97", Q8_0, func() []byte {
			b := make([]byte, 34)
			putF16(b, 0.5)
			for j := range 32 {
				b[2+j] = byte(int8(-128 + j))
			}
			return b
		}, func(e int) float32 { return float32(-128+e) * 0.5 }},
		{"Q8_0 d=-2 qs=127-3j", Q8_0, func() []byte {
			b := make([]byte, 34)
			putF16(b, -2)
			for j := range 32 {
				b[2+j] = byte(int8(127 - 3*j))
			}
			return b
		}, func(e int) float32 { return float32(127-3*e) * -2 }},
		{"Q4_0 d=2", Q4_0, func() []byte {
			b := make([]byte, 18)
			putF16(b, 2)
			for j := range 16 {
				b[2+j] = byte(j) | byte(15-j)<<4
			}
			return b
		}, func(e int) float32 {
			if e < 16 {
				return float32(e-8) * 2
			}
			return float32(15-(e-16)-8) * 2
		}},
		{"Q4_1 d=0.25 m=-1", Q4_1, func() []byte {
			b := make([]byte, 20)
			putF16(b, 0.25)
			putF16(b[2:], -1)
			for j := range 16 {
				b[4+j] = byte(j) | byte(15-j)<<4
			}
			return b
		}, func(e int) float32 {
			q := e
			if e >= 16 {
				q = 15 - (e - 16)
			}
			return float32(q)*0.25 - 1
		}},
		{"Q5_0 d=1 qh=0xA5C3_0F11", Q5_0, func() []byte {
			b := make([]byte, 22)
			putF16(b, 1)
			binary.LittleEndian.PutUint32(b[2:], 0xA5C30F11)
			for j := range 16 {
				b[6+j] = byte(j) | byte(15-j)<<4
			}
			return b
		}, func(e int) float32 {
			q := e
			if e >= 16 {
				q = 15 - (e - 16)
			}
			q += int(uint32(0xA5C30F11)>>e&1) * 16
			return float32(q - 16)
		}},
		{"Q5_1 d=0.5 m=3 qh=0x8000_0001", Q5_1, func() []byte {
			b := make([]byte, 24)
			putF16(b, 0.5)
			putF16(b[2:], 3)
			binary.LittleEndian.PutUint32(b[4:], 0x80000001)
			for j := range 16 {
				b[8+j] = 0xf0
			}
			return b
		}, func(e int) float32 {
			q := 0
			if e >= 16 {
				q = 15
			}
			if e == 0 || e == 31 {
				q += 16
			}
			return float32(q)*0.5 + 3
		}},
		{"Q4_K d=0.5 dmin=0.25 six-bit scales", Q4_K, q4k(false), q4kWant(false)},
		{"Q5_K d=0.5 dmin=0.25 six-bit scales", Q5_K, q4k(true), q4kWant(true)},
		{"Q6_K d=0.25 signed scales", Q6_K, func() []byte {
			b := make([]byte, 210)
			for i := range 128 {
				b[i] = byte(i*11 + 5) // ql
			}
			for i := range 64 {
				b[128+i] = byte(i*29 + 1) // qh
			}
			for i := range 16 {
				b[192+i] = byte(int8(-128 + 17*i)) // scales
			}
			putF16(b[208:], 0.25)
			return b
		}, func(e int) float32 {
			half, r := e/128, e%128
			k, l := r/32, r%32
			ql := byte((64*half+l+32*(k%2))*11 + 5)
			lo := ql & 15
			if k >= 2 {
				lo = ql >> 4
			}
			hi := byte((32*half+l)*29+1) >> (2 * k) & 3
			q := int(lo) | int(hi)<<4
			s := -128 + 17*(e/16)
			return 0.25 * float32(s) * float32(q-32)
		}},
		{"F16 1.5 -2 65504 2^-24", F16, func() []byte {
			return []byte{0x00, 0x3e, 0x00, 0xc0, 0xff, 0x7b, 0x01, 0x00}
		}, func(e int) float32 { return []float32{1.5, -2, 65504, 0x1p-24}[e] }},
		{"BF16 1 -3 1.0078125", BF16, func() []byte {
			return []byte{0x80, 0x3f, 0x40, 0xc0, 0x81, 0x3f}
		}, func(e int) float32 { return []float32{1, -3, 1.0078125}[e] }},
		{"F32 pi -0", F32, func() []byte {
			b := make([]byte, 8)
			binary.LittleEndian.PutUint32(b, math.Float32bits(math.Pi))
			binary.LittleEndian.PutUint32(b[4:], 0x80000000)
			return b
		}, func(e int) float32 { return []float32{math.Pi, float32(math.Copysign(0, -1))}[e] }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := c.blk()
			n := len(b) / c.typ.TypeSize() * c.typ.BlockSize()
			got := make([]float32, n)
			if err := DequantizeRow(c.typ, b, got); err != nil {
				t.Fatal(err)
			}
			x := make([]float32, n)
			var dot float64
			for e := range got {
				if w := c.want(e); !sameBits(got[e], w) {
					t.Fatalf("element %d = %v, want %v", e, got[e], w)
				}
				x[e] = float32(e%5) - 2
				dot += float64(got[e]) * float64(x[e])
			}
			if d := Dot(c.typ, b, x); math.Abs(float64(d)-dot) > 1e-4*math.Abs(dot)+1e-4 {
				t.Fatalf("Dot = %v, want %v", d, dot)
			}
		})
	}
}

// rowLens are row lengths for a type: one block, a few, Qwen2.5-0.5B's
// 896 (for the 32-blocks) and 2048.
func rowLens(typ Type) []int {
	bs := typ.BlockSize()
	if bs == 1 {
		return []int{1, 3, 8, 17, 896, 2048}
	}
	if bs == 32 {
		return []int{32, 96, 896, 2048}
	}
	return []int{256, 768, 2048}
}

// TestDequantizeMatchesLayout checks every kernel (pure Go and assembly)
// against the element-at-a-time decoder over random blocks, bit for bit.
func TestDequantizeMatchesLayout(t *testing.T) { atEachLevel(t, testDequantizeMatchesLayout) }

func testDequantizeMatchesLayout(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, typ := range allTypes {
		t.Run(typ.String(), func(t *testing.T) {
			for _, n := range rowLens(typ) {
				for range 5 {
					row := randomRow(r, typ, n)
					// Fully random bytes too (NaN and Inf scales included).
					raw := make([]byte, len(row))
					for i := range raw {
						raw[i] = byte(r.Uint32())
					}
					for _, b := range [][]byte{row, raw} {
						got := make([]float32, n)
						if err := DequantizeRow(typ, b, got); err != nil {
							t.Fatal(err)
						}
						want := refRow(typ, b, n)
						for e := range got {
							if !sameBits(got[e], want[e]) {
								t.Fatalf("n=%d element %d = %v, want %v", n, e, got[e], want[e])
							}
						}
					}
				}
			}
		})
	}
}

// TestRoundTrip quantizes normal data (8192 elements, at three scales) and
// checks the relative RMS error of the decoded values per type; with
// outliers (gaussOutliers) the bound is 1.6 times looser, on short rows
// (noisier statistics) 1.3 times.
func TestRoundTrip(t *testing.T) {
	bound := map[Type]float64{
		F32: 0, F16: 0.0005, BF16: 0.003,
		Q8_0: 0.01, Q4_0: 0.10, Q4_1: 0.09, Q5_0: 0.05, Q5_1: 0.045,
		Q4_K: 0.08, Q5_K: 0.042, Q6_K: 0.022,
	}
	r := rand.New(rand.NewPCG(3, 4))
	for _, typ := range allTypes {
		t.Run(typ.String(), func(t *testing.T) {
			for _, n := range append(rowLens(typ), 8192) {
				for _, sd := range []float64{0.02, 1, 300} {
					for _, outl := range []bool{false, true} {
						x := gauss(r, n, sd)
						if outl {
							x = gaussOutliers(r, n, sd)
						}
						b := make([]byte, mustRowBytes(t, typ, n))
						if err := Quantize(typ, x, b); err != nil {
							t.Fatal(err)
						}
						y := make([]float32, n)
						if err := DequantizeRow(typ, b, y); err != nil {
							t.Fatal(err)
						}
						lim := bound[typ]
						if outl {
							lim *= 1.6
						}
						if n < 8192 {
							lim *= 1.3
						}
						if e := relRMS(x, y); e > lim {
							t.Errorf("n=%d sd=%v outliers=%v: relative RMS error %.4f > %.4f", n, sd, outl, e, lim)
						} else if n == 8192 && sd == 1 {
							t.Logf("n=%d sd=%v outliers=%v: relative RMS error %.5f", n, sd, outl, e)
						}
					}
				}
			}
		})
	}
}

// TestQuantizeEdgeCases: all-zero, constant, single-spike and
// tiny-magnitude rows quantize to valid blocks that decode close to the
// input (zeros exactly).
func TestQuantizeEdgeCases(t *testing.T) {
	rows := map[string]func(n int) []float32{
		"zeros": func(n int) []float32 { return make([]float32, n) },
		"constant": func(n int) []float32 {
			x := make([]float32, n)
			for i := range x {
				x[i] = 0.75
			}
			return x
		},
		"negative constant": func(n int) []float32 {
			x := make([]float32, n)
			for i := range x {
				x[i] = -3
			}
			return x
		},
		"spike": func(n int) []float32 {
			x := make([]float32, n)
			x[n/3] = 100
			return x
		},
		"tiny": func(n int) []float32 {
			x := make([]float32, n)
			for i := range x {
				x[i] = float32(i%7-3) * 1e-9
			}
			return x
		},
	}
	for _, typ := range allTypes {
		for name, mk := range rows {
			t.Run(typ.String()+"/"+name, func(t *testing.T) {
				n := 512
				x := mk(n)
				b := make([]byte, mustRowBytes(t, typ, n))
				if err := Quantize(typ, x, b); err != nil {
					t.Fatal(err)
				}
				y := make([]float32, n)
				if err := DequantizeRow(typ, b, y); err != nil {
					t.Fatal(err)
				}
				var amax float64
				for _, v := range x {
					amax = max(amax, math.Abs(float64(v)))
				}
				for i := range y {
					if math.IsNaN(float64(y[i])) || math.IsInf(float64(y[i]), 0) {
						t.Fatalf("element %d decodes to %v", i, y[i])
					}
					if err := math.Abs(float64(y[i]) - float64(x[i])); err > 0.07*amax+1e-7 {
						t.Fatalf("element %d: %v decodes to %v", i, x[i], y[i])
					}
					if amax == 0 && y[i] != 0 {
						t.Fatalf("zero row element %d decodes to %v", i, y[i])
					}
				}
			})
		}
	}
}

// vnniTestForm is a form of the AVX2 level's Q8_0/Q5_0/Q4_0 kernels
// (avxVNNI's values) and the name of its subtests.
type vnniTestForm struct {
	name string
	form int
}

// atEachLevel runs f once per kernel level this machine has (pure Go, and
// the AVX2 and AVX-512 assembly where the build and CPU have them),
// switching package simd's level, which the kernels follow.
func atEachLevel(t *testing.T, f func(t *testing.T)) {
	prev := simd.Current()
	defer simd.SetLevel(prev)
	var levels []simd.Level
	for _, l := range []simd.Level{simd.Generic, simd.AVX2, simd.AVX512} {
		if simd.Supported(l) {
			levels = append(levels, l)
		}
	}
	for _, l := range levels {
		if _, err := simd.SetLevel(l); err != nil {
			t.Fatal(err)
		}
		t.Run(asmLevel(), f)
		if l == simd.AVX512 && hasVBMI { // and the VNNI kernels the VBMI ones replace
			hasVBMI = false
			t.Run(asmLevel()+"-novbmi", f)
			hasVBMI = true
		}
		if l == simd.AVX2 { // and the other forms of its Q8_0/Q5_0/Q4_0 kernels
			for _, form := range otherVNNIForms() {
				prev := avxVNNI
				avxVNNI = form.form
				t.Run(asmLevel()+"-"+form.name, f)
				avxVNNI = prev
			}
		}
	}
}

// TestDot checks Dot against the float64 dot of the dequantized row, for
// random and quantized rows of every type and length, with the pure-Go
// kernels and with the assembly.
func TestDot(t *testing.T) { atEachLevel(t, testDot) }

func testDot(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, typ := range allTypes {
		t.Run(typ.String(), func(t *testing.T) {
			for _, n := range rowLens(typ) {
				x := gauss(r, n, 1)
				for k := range 4 {
					var row []byte
					if k%2 == 0 {
						row = randomRow(r, typ, n)
					} else {
						row = make([]byte, mustRowBytes(t, typ, n))
						if err := Quantize(typ, gauss(r, n, 0.05), row); err != nil {
							t.Fatal(err)
						}
					}
					checkDot(t, typ, row, x, Dot(typ, row, x))
				}
			}
		})
	}
}

// checkDot fails unless got is Σ w·x of the dequantized row within
// float32 summation error.
func checkDot(t *testing.T, typ Type, row []byte, x []float32, got float32) {
	t.Helper()
	w := make([]float32, len(x))
	if err := DequantizeRow(typ, row, w); err != nil {
		t.Fatal(err)
	}
	var want, mag float64
	for i := range w {
		p := float64(w[i]) * float64(x[i])
		want += p
		mag += math.Abs(p)
	}
	if d := math.Abs(float64(got) - want); d > 2e-5*mag+1e-30 {
		t.Fatalf("n=%d: dot %v, want %v (diff %g, Σ|wx| %g)", len(x), got, want, d, mag)
	}
}

// TestDotRows: DotRows is Dot per row, bit for bit.
func TestDotRows(t *testing.T) { atEachLevel(t, testDotRows) }

func testDotRows(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, typ := range allTypes {
		t.Run(typ.String(), func(t *testing.T) {
			n := 512
			rows := 7
			rb := mustRowBytes(t, typ, n)
			w := make([]byte, 0, rows*rb)
			for range rows {
				w = append(w, randomRow(r, typ, n)...)
			}
			x := gauss(r, n, 1)
			dst := make([]float32, rows)
			DotRows(typ, dst, w, rb, x)
			for i := range dst {
				if want := Dot(typ, w[i*rb:(i+1)*rb], x); !sameBits(dst[i], want) {
					t.Fatalf("row %d: %v, Dot gives %v", i, dst[i], want)
				}
			}
		})
	}
}

// TestDequantizeRows: DequantizeRows is DequantizeRow per row.
func TestDequantizeRows(t *testing.T) { atEachLevel(t, testDequantizeRows) }

func testDequantizeRows(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for _, typ := range allTypes {
		t.Run(typ.String(), func(t *testing.T) {
			n, rows := 256, 9
			rb := mustRowBytes(t, typ, n)
			var w []byte
			for range rows {
				w = append(w, randomRow(r, typ, n)...)
			}
			for _, rg := range [][2]int{{0, rows}, {2, 5}, {8, 9}, {4, 4}} {
				dst := make([]float32, (rg[1]-rg[0])*n)
				if err := DequantizeRows(typ, w, n, rg[0], rg[1], dst); err != nil {
					t.Fatal(err)
				}
				one := make([]float32, n)
				for i := rg[0]; i < rg[1]; i++ {
					if err := DequantizeRow(typ, w[i*rb:(i+1)*rb], one); err != nil {
						t.Fatal(err)
					}
					for e := range one {
						if !sameBits(one[e], dst[(i-rg[0])*n+e]) {
							t.Fatalf("rows %v: row %d element %d differs", rg, i, e)
						}
					}
				}
			}
		})
	}
}

// TestErrors: bad types and sizes give the sentinel errors (never a
// panic), and Dot/DotRows panic on them.
func TestErrors(t *testing.T) {
	q := make([]byte, 144)
	cases := []struct {
		name string
		err  error
		want error
	}{
		{"dequantize unsupported type", DequantizeRow(Q2_K, make([]byte, 84), make([]float32, 256)), ErrUnsupported},
		{"dequantize unknown type", DequantizeRow(Type(99), nil, nil), ErrUnsupported},
		{"dequantize partial block", DequantizeRow(Q4_K, q, make([]float32, 255)), ErrSize},
		{"dequantize short src", DequantizeRow(Q4_K, q[:143], make([]float32, 256)), ErrSize},
		{"dequantize long src", DequantizeRow(Q8_0, make([]byte, 35), make([]float32, 32)), ErrSize},
		{"rows past the end", DequantizeRows(Q4_K, q, 256, 0, 2, make([]float32, 512)), ErrSize},
		{"rows reversed", DequantizeRows(Q4_K, q, 256, 1, 0, nil), ErrSize},
		{"rows negative", DequantizeRows(Q4_K, q, 256, -1, 1, make([]float32, 512)), ErrSize},
		{"rows small dst", DequantizeRows(Q4_K, q, 256, 0, 1, make([]float32, 255)), ErrSize},
		{"rows bad length", DequantizeRows(Q4_K, q, 100, 0, 1, make([]float32, 100)), ErrSize},
		{"rows unsupported", DequantizeRows(IQ2_XXS, q, 256, 0, 1, make([]float32, 256)), ErrUnsupported},
		{"quantize bad size", Quantize(Q8_0, make([]float32, 32), make([]byte, 33)), ErrSize},
		{"quantize unsupported", Quantize(Q3_K, make([]float32, 256), make([]byte, 110)), ErrUnsupported},
		{"quantize NaN", Quantize(Q4_K, append(make([]float32, 255), float32(math.NaN())), make([]byte, 144)), ErrNonFinite},
		{"quantize Inf", Quantize(Q8_0, append(make([]float32, 31), float32(math.Inf(-1))), make([]byte, 34)), ErrNonFinite},
		{"quantize rows ragged", func() error { _, err := QuantizeRows(Q8_0, make([]float32, 48), 32); return err }(), ErrSize},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if !errors.Is(c.err, c.want) {
				t.Fatalf("error %v, want %v", c.err, c.want)
			}
			if !strings.HasPrefix(c.err.Error(), "quant: ") {
				t.Fatalf("error %q lacks the package prefix", c.err)
			}
		})
	}
	if err := Quantize(F16, []float32{float32(math.Inf(1)), float32(math.NaN())}, make([]byte, 4)); err != nil {
		t.Fatalf("F16 must encode Inf and NaN: %v", err)
	}
	panics := map[string]func(){
		"Dot short row":      func() { Dot(Q8_0, make([]byte, 33), make([]float32, 32)) },
		"Dot partial block":  func() { Dot(Q4_K, make([]byte, 144), make([]float32, 200)) },
		"Dot unsupported":    func() { Dot(Q2_K, make([]byte, 84), make([]float32, 256)) },
		"DotRows bad stride": func() { DotRows(Q8_0, make([]float32, 2), make([]byte, 70), 35, make([]float32, 32)) },
		"DotRows short w":    func() { DotRows(Q8_0, make([]float32, 3), make([]byte, 68), 34, make([]float32, 32)) },
	}
	for name, f := range panics {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			f()
		})
	}
}

// TestSupported lists the computable types.
func TestSupported(t *testing.T) {
	for typ := range Type(64) {
		want := false
		for _, s := range allTypes {
			want = want || s == typ
		}
		if typ.Supported() != want {
			t.Errorf("%v.Supported() = %v", typ, !want)
		}
	}
}

// TestQuantizeRows matches Quantize per row.
func TestQuantizeRows(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	x := gauss(r, 3*256, 1)
	b, err := QuantizeRows(Q6_K, x, 256)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		one := make([]byte, 210)
		if err := Quantize(Q6_K, x[i*256:(i+1)*256], one); err != nil {
			t.Fatal(err)
		}
		if string(one) != string(b[i*210:(i+1)*210]) {
			t.Fatalf("row %d differs", i)
		}
	}
}

// TestNoAllocs: the hot paths allocate nothing.
func TestNoAllocs(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	for _, typ := range allTypes {
		n := 1024
		rb := mustRowBytes(t, typ, n)
		w := randomRow(r, typ, 4*n)
		x := gauss(r, n, 1)
		dst := make([]float32, 4)
		buf := make([]float32, 4*n)
		if a := testing.AllocsPerRun(10, func() {
			Dot(typ, w[:rb], x)
			DotRows(typ, dst, w, rb, x)
			_ = DequantizeRows(typ, w, n, 0, 4, buf)
		}); a != 0 {
			t.Errorf("%v: %v allocations per run", typ, a)
		}
	}
}

// TestQuantizeRange: values whose scale would overflow f16 fail with
// ErrRange rather than encode Inf.
func TestQuantizeRange(t *testing.T) {
	for _, typ := range allTypes {
		if scaleOffsets[typ] == nil {
			continue
		}
		t.Run(typ.String(), func(t *testing.T) {
			x := make([]float32, 256)
			x[5] = 1e12
			err := Quantize(typ, x, make([]byte, mustRowBytes(t, typ, 256)))
			if !errors.Is(err, ErrRange) {
				t.Fatalf("error %v, want ErrRange", err)
			}
			x[5] = 60000 // fits every type's scale
			if err := Quantize(typ, x, make([]byte, mustRowBytes(t, typ, 256))); err != nil {
				t.Fatal(err)
			}
		})
	}
}
