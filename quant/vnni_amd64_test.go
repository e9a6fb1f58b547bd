//go:build amd64 && !noasm

package quant

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cacheblend/cacheblend/simd"
)

// otherVNNIForms lists the forms of the AVX2 level's Q8_0/Q5_0/Q4_0
// kernels that this CPU runs besides avxVNNI's own: the plain AVX2 kernels
// where AVX-VNNI is used, and where it is absent the …EVEXVNNI twins of
// the AVX-VNNI kernels when the CPU has AVX-512 VNNI.
func otherVNNIForms() []vnniTestForm {
	type f = vnniTestForm
	switch {
	case avxVNNI == vnniVEX:
		return []f{{"novnni", vnniNone}}
	case hasVNNI:
		return []f{{"evexvnni", vnniEVEX}}
	}
	return nil
}

// decodeVPDPBUSD decodes the VEX-encoded VPDPBUSD ymm forms the AVX-VNNI
// kernels use (3-byte VEX, map 0F38, W0, L1, pp 66, opcode 0x50; a
// register, or a base register with no, an 8-bit or a 32-bit
// displacement, no SIB) into Go's assembler syntax, e.g. "VPDPBUSD
// 32(DI), Y1, Y3". It reports false for any other bytes.
func decodeVPDPBUSD(b []byte) (string, bool) {
	if len(b) < 5 || b[0] != 0xc4 || b[1]&0x1f != 0x02 || b[2]&0x87 != 0x05 || b[3] != 0x50 {
		return "", false
	}
	regs := [...]string{"AX", "CX", "DX", "BX", "SP", "BP", "SI", "DI", "R8", "R9", "R10", "R11", "R12", "R13", "R14", "R15"}
	rExt, bExt := int(^b[1]>>7&1)<<3, int(^b[1]>>5&1)<<3
	u := int(^b[2]>>3) & 15
	modrm := b[4]
	dst := rExt | int(modrm>>3&7)
	rm := bExt | int(modrm&7)
	rest := b[5:]
	var src string
	switch mod := modrm >> 6; {
	case mod == 3:
		src = fmt.Sprintf("Y%d", rm)
	case rm&7 == 4 || mod == 0 && rm&7 == 5: // SIB or RIP-relative: not used
		return "", false
	case mod == 0:
		src = fmt.Sprintf("(%s)", regs[rm])
	case mod == 1 && len(rest) >= 1:
		src, rest = fmt.Sprintf("%d(%s)", int8(rest[0]), regs[rm]), rest[1:]
	case mod == 2 && len(rest) >= 4:
		src, rest = fmt.Sprintf("%d(%s)", int32(binary.LittleEndian.Uint32(rest)), regs[rm]), rest[4:]
	default:
		return "", false
	}
	if len(rest) != 0 {
		return "", false
	}
	return fmt.Sprintf("VPDPBUSD %s, Y%d, Y%d", src, u, dst), true
}

// TestAVXVNNIEncoding checks the AVX-VNNI kernels, which this machine may
// not be able to run, against their …EVEXVNNI twins, which the other tests
// run wherever AVX-512 VNNI is: each …AVXVNNI kernel in dot_amd64.s must
// be its twin line for line, but for every VPDPBUSD written as bytes,
// which must decode to the twin's VPDPBUSD. The decoder is first checked
// against LLVM's encodings of {vex} vpdpbusd (llvm/test/MC/X86/
// intel-syntax-avx_vnni.s), so that a wrong byte in the generator
// (vpdpbusdDI) fails here instead of on a CPU with AVX-VNNI.
func TestAVXVNNIEncoding(t *testing.T) {
	for _, tc := range []struct {
		name  string
		bytes []byte
		want  string
	}{
		{"register", []byte{0xc4, 0xe2, 0x55, 0x50, 0xf4}, "VPDPBUSD Y4, Y5, Y6"},
		{"base", []byte{0xc4, 0xe2, 0x55, 0x50, 0x30}, "VPDPBUSD (AX), Y5, Y6"},
		{"disp32", []byte{0xc4, 0xe2, 0x55, 0x50, 0xb1, 0xe0, 0x0f, 0x00, 0x00}, "VPDPBUSD 4064(CX), Y5, Y6"},
		{"negative disp32", []byte{0xc4, 0xe2, 0x55, 0x50, 0xb2, 0x00, 0xf0, 0xff, 0xff}, "VPDPBUSD -4096(DX), Y5, Y6"},
		{"EVEX", []byte{0x62, 0xf2, 0x55, 0x28, 0x50, 0xf4}, ""},
		{"xmm", []byte{0xc4, 0xe2, 0x51, 0x50, 0xf4}, ""},
		{"SIB", []byte{0xc4, 0xe2, 0x55, 0x50, 0xb4, 0xf4, 0x00, 0x00, 0x00, 0x10}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := decodeVPDPBUSD(tc.bytes)
			if ok != (tc.want != "") || got != tc.want {
				t.Fatalf("decode % x = %q, %v; want %q", tc.bytes, got, ok, tc.want)
			}
		})
	}

	src, err := os.ReadFile("dot_amd64.s")
	if err != nil {
		t.Fatal(err)
	}
	// The kernels' bodies by name, TEXT to RET.
	bodies := map[string][]string{}
	var cur string
	for _, line := range strings.Split(string(src), "\n") {
		if strings.HasPrefix(line, "TEXT ·") {
			cur = line[len("TEXT ·"):strings.Index(line, "(SB)")]
		}
		if cur != "" {
			bodies[cur] = append(bodies[cur], line)
		}
		if line == "\tRET" { // the kernels' one return
			cur = ""
		}
	}
	kernels, instrs := 0, 0
	for name, body := range bodies {
		base, ok := strings.CutSuffix(name, "AVXVNNI")
		if !ok {
			continue
		}
		kernels++
		twin := bodies[base+"EVEXVNNI"]
		if len(twin) != len(body) {
			t.Fatalf("%s: %d lines, its twin %d", name, len(body), len(twin))
		}
		for i, line := range body {
			want := strings.ReplaceAll(twin[i], "EVEXVNNI", "AVXVNNI")
			if !strings.Contains(line, "BYTE $") {
				if line != want {
					t.Fatalf("%s line %d: %q, its twin %q", name, i, line, twin[i])
				}
				continue
			}
			var b []byte
			code, _, _ := strings.Cut(line, "//")
			for _, f := range strings.Split(code, ";") {
				f = strings.TrimSpace(f)
				op, arg, _ := strings.Cut(f, " $")
				v, err := strconv.ParseUint(arg, 0, 32)
				if err != nil {
					t.Fatalf("%s line %d: %q: %v", name, i, f, err)
				}
				switch op {
				case "BYTE":
					b = append(b, byte(v))
				case "LONG":
					b = binary.LittleEndian.AppendUint32(b, uint32(v))
				default:
					t.Fatalf("%s line %d: %q", name, i, f)
				}
			}
			got, ok := decodeVPDPBUSD(b)
			if !ok || "\t"+got != want {
				t.Fatalf("%s line %d: % x decodes to %q, %v; its twin has %q", name, i, b, got, ok, strings.TrimSpace(want))
			}
			instrs++
		}
	}
	if kernels != 12 || instrs == 0 {
		t.Fatalf("%d AVX-VNNI kernels with %d VPDPBUSD, want 12 and some", kernels, instrs)
	}
}

// BenchmarkAVX2Forms: the AVX2 level's Q8_0/Q5_0/Q4_0 kernels in each form
// this CPU runs (VPMADDUBSW + VPMADDWD; VPDPBUSD, VEX or its EVEX twin),
// DotQ80RowsMany over a 2048 × 2048 matrix (in cache levels beyond L2)
// with 1 and 4 activation rows, on one core; ns/weight is per weight and
// row.
func BenchmarkAVX2Forms(b *testing.B) {
	if !simd.Supported(simd.AVX2) {
		b.Fatal("no AVX2 here")
	}
	prev := simd.Current()
	defer simd.SetLevel(prev)
	if _, err := simd.SetLevel(simd.AVX2); err != nil {
		b.Fatal(err)
	}
	// The CPU's own form and the others it runs, plain AVX2 first.
	forms := append([]vnniTestForm{{"own", avxVNNI}}, otherVNNIForms()...)
	slices.SortFunc(forms, func(a, b vnniTestForm) int { return a.form - b.form })
	r := rand.New(rand.NewPCG(3, 4))
	const k, rows = 2048, 2048
	for _, typ := range []Type{Q8_0, Q5_0, Q4_0} {
		rb, _ := typ.RowBytes(k)
		all := randomRow(r, typ, k*rows)
		ws := make([][]byte, rows)
		for i := range ws {
			ws[i] = all[i*rb : (i+1)*rb]
		}
		for _, R := range []int{1, 4} {
			xs := make([][]float32, R)
			for i := range xs {
				xs[i] = gauss(r, k, 1)
			}
			var x Q80Rows
			if err := x.Quantize(xs...); err != nil {
				b.Fatal(err)
			}
			out := make([]float32, rows*R)
			for _, f := range forms {
				name := [...]string{vnniNone: "avx2", vnniVEX: "avxvnni", vnniEVEX: "evexvnni"}[f.form]
				b.Run(fmt.Sprintf("%s/rows%d/%s", typ, R, name), func(b *testing.B) {
					defer func(prev int) { avxVNNI = prev }(avxVNNI)
					avxVNNI = f.form
					b.ReportAllocs()
					for b.Loop() {
						DotQ80RowsMany(typ, ws, &x, out)
					}
					b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(k*rows*R), "ns/weight")
					b.ReportMetric(float64(b.N)*float64(len(all))/b.Elapsed().Seconds()/1e9, "GB/s")
				})
			}
		}
	}
}
