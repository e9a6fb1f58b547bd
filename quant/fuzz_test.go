package quant

import (
	"encoding/binary"
	"errors"
	"math"
	"testing"
)

// FuzzDequantize feeds arbitrary bytes as the blocks of every type: no
// panic, every element equals the element-at-a-time layout decoder and
// the pure-Go kernel bit for bit, blocks whose scales are finite decode to
// finite values, and Dot (assembly where present) and the pure-Go dot
// agree with the dequantized row.
func FuzzDequantize(f *testing.F) {
	f.Add(uint8(0), []byte{0, 0, 0x80, 0x3f})
	f.Add(uint8(7), make([]byte, 144))
	f.Add(uint8(9), []byte("\x00\x7c\xff\xff\x00\x7e"))
	for i := range 210 {
		f.Add(uint8(9), make([]byte, i))
	}
	f.Fuzz(func(t *testing.T, sel uint8, data []byte) {
		typ := allTypes[int(sel)%len(allTypes)]
		bs, ts := typ.BlockSize(), typ.TypeSize()
		data = data[:min(len(data), 64<<10)]
		nb := len(data) / ts
		row, n := data[:nb*ts], nb*bs
		if len(row) < len(data) {
			if err := DequantizeRow(typ, data[:len(row)+1], make([]float32, n)); err == nil {
				t.Fatal("a row with a trailing byte was accepted")
			}
		}
		y := make([]float32, n+1)
		y[n] = 42
		if err := DequantizeRow(typ, row, y[:n]); err != nil {
			t.Fatal(err)
		}
		if y[n] != 42 {
			t.Fatal("wrote past the row")
		}
		y = y[:n]
		if n > 0 {
			yg := make([]float32, n)
			kern[typ].dequantGo(row, yg)
			for e := range y {
				if !sameBits(y[e], yg[e]) {
					t.Fatalf("%v element %d = %v, pure Go gives %v", typ, e, y[e], yg[e])
				}
			}
		}
		x := make([]float32, n)
		var want, mag float64
		finite := true
		for e := range y {
			if r := refElem(typ, row, e); !sameBits(y[e], r) {
				t.Fatalf("%v element %d = %v, layout gives %v", typ, e, y[e], r)
			}
			v := float64(y[e])
			if math.IsNaN(v) || math.IsInf(v, 0) || math.Abs(v) > 1e30 {
				finite = false
			}
			x[e] = float32(e%3) - 1
			want += v * float64(x[e])
			mag += math.Abs(v * float64(x[e]))
		}
		if offs := scaleOffsets[typ]; offs != nil {
			for blk := range nb {
				ok := true
				for _, o := range offs {
					h := binary.LittleEndian.Uint16(row[blk*ts+o:])
					ok = ok && h&0x7c00 != 0x7c00
				}
				for e := blk * bs; ok && e < (blk+1)*bs; e++ {
					if math.IsNaN(float64(y[e])) || math.IsInf(float64(y[e]), 0) {
						t.Fatalf("%v block %d has finite scales but element %d = %v", typ, blk, e, y[e])
					}
				}
			}
		}
		got := Dot(typ, row, x)
		if finite && math.Abs(float64(got)-want) > 2e-5*mag+1e-30 {
			t.Fatalf("%v: Dot %v, dequantized dot %v", typ, got, want)
		}
		if n > 0 {
			if g := kern[typ].dotGo(row, x); finite && math.Abs(float64(g)-want) > 2e-5*mag+1e-30 {
				t.Fatalf("%v: pure-Go dot %v, dequantized dot %v", typ, g, want)
			}
		}
	})
}

// FuzzQuantize quantizes arbitrary float32 rows with every type: finite
// input either quantizes or fails with ErrRange (a scale past the f16
// range), never panics, and decodes to finite values within each block's
// value range of the input.
func FuzzQuantize(f *testing.F) {
	f.Add(uint8(7), []byte{0, 0, 0x80, 0x3f, 0, 0, 0x80, 0xbf})
	f.Add(uint8(9), []byte{0xff, 0xff, 0x7f, 0x7f})
	f.Add(uint8(2), []byte{1, 0, 0, 0, 0, 0, 0x80, 0x4b})
	f.Fuzz(func(t *testing.T, sel uint8, data []byte) {
		typ := allTypes[int(sel)%len(allTypes)]
		bs := typ.BlockSize()
		n := min(len(data)/4, 2048) / bs * bs // bounded: subnormals make quantizing slow
		if n == 0 {
			return
		}
		x := make([]float32, n)
		for i := range x {
			v := math.Float32frombits(binary.LittleEndian.Uint32(data[4*(i%(len(data)/4)):]))
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				v = 0
			}
			x[i] = v
		}
		q := make([]byte, mustRowBytes(t, typ, n))
		err := Quantize(typ, x, q)
		if errors.Is(err, ErrRange) && scaleOffsets[typ] != nil {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		y := make([]float32, n)
		if err := DequantizeRow(typ, q, y); err != nil {
			t.Fatal(err)
		}
		if scaleOffsets[typ] == nil {
			return // the float types: Inf on overflow is their encoding
		}
		for b := 0; b < n; b += bs {
			lo, hi := x[b], x[b]
			for _, v := range x[b : b+bs] {
				lo, hi = min(lo, v), max(hi, v)
			}
			span := float64(hi) - float64(lo) + math.Max(math.Abs(float64(lo)), math.Abs(float64(hi)))
			for i := b; i < b+bs; i++ {
				v := float64(y[i])
				if math.IsNaN(v) || math.IsInf(v, 0) {
					t.Fatalf("%v element %d: %v decodes to %v", typ, i, x[i], y[i])
				}
				if math.Abs(v-float64(x[i])) > 1.01*span+1e-30 {
					t.Fatalf("%v element %d: %v decodes to %v (block range [%v, %v])", typ, i, x[i], y[i], lo, hi)
				}
			}
		}
	})
}
