//go:build ignore

// gen writes dot_amd64.s, the assembly kernels of package quant: dot
// kernels for AVX2 + FMA + F16C (…AVX2, ymm) and AVX-512 (…AVX512, zmm),
// and AVX2 dequantizers. Run it with `go generate ./quant`;
// TestGeneratedUpToDate fails when the committed file is stale.
//
// Every dot kernel streams one weight row against float32 activations:
// the quants are widened to int32 lanes (VPMOVZXBD/VPMOVSXBD straight
// from memory, 8 or 16 at a time), their bit fields are cut out with
// shifts and masks in the int32 lanes, converted to float32 and
// multiplied into per-sub-block partial sums, and each sub-block's scale
// is applied once to its partial vector with a fused multiply-add into
// the row's accumulators. Scales stored as halves are decoded with
// VCVTPH2PS. The dequantizers do the same unpacking and then ggml's exact
// float operations (no fused multiply-add), storing the values.
package main

import (
	"bytes"
	"fmt"
	"math"
	"os"
)

var out bytes.Buffer

func p(format string, args ...any) { fmt.Fprintf(&out, format+"\n", args...) }

// bcastConst sets every int32 lane of Y(reg) to v (clobbers AX).
func bcastConst(reg int, v uint32) {
	p("\tMOVL $0x%08x, AX", v)
	p("\tVMOVD AX, X%d", reg)
	p("\tVPBROADCASTD X%d, Y%d", reg, reg)
}

// hsumRet reduces Y0 to its lane sum and returns it as the float32 result
// at ret.
func hsumRet(ret int) {
	p("\tVEXTRACTF128 $1, Y0, X1")
	p("\tVADDPS X1, X0, X0")
	p("\tVHADDPS X0, X0, X0")
	p("\tVHADDPS X0, X0, X0")
	p("\tVMOVSS X0, ret+%d(FP)", ret)
	p("\tVZEROUPPER")
	p("\tRET")
}

// The "Many" form of a dot kernel computes one dot per weight row of a
// [][]byte: its arguments are (ws *[]byte, the single-row kernel's other
// arguments, rows int, out *float32) instead of (w *byte, …) float32, and
// it keeps its place in a 24-byte frame: 0(SP) the next row's slice header
// (its data pointer is the row), 8(SP) the rows left, 16(SP) where the
// next result goes. One call covers a task's rows, so the constants are
// set once and no Go code runs between rows.

// manyStart opens a Many kernel's row loop (rowsArg and outArg: the frame
// offsets of rows and out); SI is the row at the label.
func manyStart(name string, rowsArg, outArg int) {
	p("\tMOVQ ws+0(FP), AX")
	p("\tMOVQ AX, 0(SP)")
	p("\tMOVQ rows+%d(FP), AX", rowsArg)
	p("\tMOVQ AX, 8(SP)")
	p("\tMOVQ out+%d(FP), AX", outArg)
	p("\tMOVQ AX, 16(SP)")
	p("%s_row:", name)
	p("\tMOVQ 0(SP), AX")
	p("\tMOVQ (AX), SI")
}

// hsumNext reduces Y0 to its lane sum, stores it as the row's result and
// loops to the next row (see manyStart).
func hsumNext(name string) {
	p("\tVEXTRACTF128 $1, Y0, X1")
	p("\tVADDPS X1, X0, X0")
	p("\tVHADDPS X0, X0, X0")
	p("\tVHADDPS X0, X0, X0")
	p("\tMOVQ 16(SP), AX")
	p("\tVMOVSS X0, (AX)")
	p("\tADDQ $4, 16(SP)")
	p("\tADDQ $24, 0(SP)")
	p("\tDECQ 8(SP)")
	p("\tJNZ %s_row", name)
	p("\tVZEROUPPER")
	p("\tRET")
}

// aheadStart loads the Many kernels' prefetch distance (streamAhead, in
// bytes) into R15.
func aheadStart() { p("\tMOVQ ·streamAhead(SB), R15") }

// ahead asks for the step bytes at SI+R15 (the weights a Many kernel's
// loop reads streamAhead bytes on), one PREFETCHNTA per 64 bytes: every
// line of them, wherever they start. With streamAhead 0 the requests are
// for the lines being read: the instructions without the prefetch.
func ahead(step int) {
	for o := 0; o < step; o += 64 {
		p("\tPREFETCHNTA %d(SI)(R15*1)", o)
	}
}

// intArgs loads the arguments of an integer dot kernel (w or ws, q, d, a
// fourth pointer named arg into reg, n) for the row at SI, opening the
// row loop of a Many kernel.
func intArgs(name string, many bool, arg, reg string) {
	if many {
		manyStart(name, 40, 48)
	} else {
		p("\tMOVQ w+0(FP), SI")
	}
	p("\tMOVQ q+8(FP), DI")
	p("\tMOVQ d+16(FP), BX")
	p("\tMOVQ %s+24(FP), %s", arg, reg)
	p("\tMOVQ n+32(FP), CX")
}

// header opens a function of the given frame size: a dot kernel (w, x
// *, n int) float32 or, when x is "y", a dequantizer (w, y *, n int).
func header(name string, frame int, x, doc string) {
	p("")
	p("// %s", doc)
	args := 28
	if x == "y" {
		args = 24
	}
	p("TEXT ·%s(SB), NOSPLIT, $%d-%d", name, frame, args)
	p("\tMOVQ w+0(FP), SI")
	p("\tMOVQ %s+8(FP), DI", x)
	p("\tMOVQ n+16(FP), CX")
}

// halfFloat: F16 (convert=true) or BF16 rows of n elements, n a multiple
// of 8: 32 elements per iteration into four accumulators.
func halfFloat(name string, f16 bool) {
	header(name, 0, "x", fmt.Sprintf("func %s(w *byte, x *float32, n int) float32: n a multiple of 8.", name))
	for i := 0; i < 4; i++ {
		p("\tVXORPS Y%d, Y%d, Y%d", i, i, i)
	}
	load := func(off, reg int) {
		if f16 {
			p("\tVCVTPH2PS %d(SI), Y%d", off, reg)
		} else {
			p("\tVPMOVZXWD %d(SI), Y%d", off, reg)
			p("\tVPSLLD $16, Y%d, Y%d", reg, reg)
		}
	}
	p("%s_32:", name)
	p("\tCMPQ CX, $32")
	p("\tJLT %s_8", name)
	for i := 0; i < 4; i++ {
		load(16*i, 4+i)
	}
	for i := 0; i < 4; i++ {
		p("\tVFMADD231PS %d(DI), Y%d, Y%d", 32*i, 4+i, i)
	}
	p("\tADDQ $64, SI")
	p("\tADDQ $128, DI")
	p("\tSUBQ $32, CX")
	p("\tJMP %s_32", name)
	p("%s_8:", name)
	p("\tTESTQ CX, CX")
	p("\tJZ %s_done", name)
	load(0, 4)
	p("\tVFMADD231PS (DI), Y4, Y0")
	p("\tADDQ $16, SI")
	p("\tADDQ $32, DI")
	p("\tSUBQ $8, CX")
	p("\tJMP %s_8", name)
	p("%s_done:", name)
	p("\tVADDPS Y1, Y0, Y0")
	p("\tVADDPS Y3, Y2, Y2")
	p("\tVADDPS Y2, Y0, Y0")
	hsumRet(24)
}

// q8_0Block accumulates one Q8_0 block at SI+off, x at DI+xoff, into
// Y(acc), using registers t..t+4.
func q8_0Block(off, xoff, acc, t int) {
	p("\tMOVWLZX %d(SI), AX", off)
	p("\tVMOVD AX, X%d", t)
	p("\tVCVTPH2PS X%d, X%d", t, t)
	p("\tVBROADCASTSS X%d, Y%d", t, t)
	for k := 0; k < 4; k++ {
		p("\tVPMOVSXBD %d(SI), Y%d", off+2+8*k, t+1+k)
	}
	for k := 0; k < 4; k++ {
		p("\tVCVTDQ2PS Y%d, Y%d", t+1+k, t+1+k)
	}
	p("\tVMULPS %d(DI), Y%d, Y%d", xoff, t+1, t+1)
	p("\tVMULPS %d(DI), Y%d, Y%d", xoff+32, t+2, t+2)
	p("\tVFMADD231PS %d(DI), Y%d, Y%d", xoff+64, t+3, t+1)
	p("\tVFMADD231PS %d(DI), Y%d, Y%d", xoff+96, t+4, t+2)
	p("\tVADDPS Y%d, Y%d, Y%d", t+2, t+1, t+1)
	p("\tVFMADD231PS Y%d, Y%d, Y%d", t+1, t, acc)
}

// q8_0: n blocks of 34 bytes (d f16, 32 int8), two per iteration.
func q8_0() {
	const name = "dotQ8_0AVX2"
	header(name, 0, "x", "func dotQ8_0AVX2(w *byte, x *float32, n int) float32: n Q8_0 blocks.")
	p("\tVXORPS Y0, Y0, Y0")
	p("\tVXORPS Y1, Y1, Y1")
	p("%s_2:", name)
	p("\tCMPQ CX, $2")
	p("\tJLT %s_1", name)
	q8_0Block(0, 0, 0, 2)
	q8_0Block(34, 128, 1, 7)
	p("\tADDQ $68, SI")
	p("\tADDQ $256, DI")
	p("\tSUBQ $2, CX")
	p("\tJMP %s_2", name)
	p("%s_1:", name)
	p("\tTESTQ CX, CX")
	p("\tJZ %s_done", name)
	q8_0Block(0, 0, 0, 2)
	p("%s_done:", name)
	p("\tVADDPS Y1, Y0, Y0")
	hsumRet(24)
}

// shiftTo4 moves bit b of every int32 lane of Y(src) to bit 4 of Y(dst)
// (other bits are garbage for the caller to mask).
func shiftTo4(src, dst, b int) {
	switch {
	case b < 4:
		p("\tVPSLLD $%d, Y%d, Y%d", 4-b, src, dst)
	case b > 4:
		p("\tVPSRLD $%d, Y%d, Y%d", b-4, src, dst)
	default:
		p("\tVMOVDQU Y%d, Y%d", src, dst)
	}
}

// q4K: n blocks of 144 bytes: d, dmin (f16), 12 bytes of 6-bit scales and
// mins, 128 bytes of nibbles (Q5_K: 176 bytes, 32 bytes of fifth bits
// before the nibbles). The scales are parked by kScales. Y0, Y1 accumulate d·sc·Σq·x, Y2, Y14 dmin·m·Σx; Y15 is
// the 0x0f mask.
func q4K(q5 bool) {
	name, size, qs := "dotQ4KAVX2", 144, 16
	if q5 {
		name, size, qs = "dotQ5KAVX2", 176, 48
	}
	header(name, 64, "x", fmt.Sprintf("func %s(w *byte, x *float32, n int) float32: n %s blocks.", name, map[bool]string{false: "Q4_K", true: "Q5_K"}[q5]))
	for _, r := range []int{0, 1, 2, 14} {
		p("\tVXORPS Y%d, Y%d, Y%d", r, r, r)
	}
	bcastConst(15, 0x0f)
	if q5 {
		bcastConst(13, 0x10)
	}
	p("\tTESTQ CX, CX")
	p("\tJZ %s_done", name)
	p("%s_block:", name)
	kScales()
	for g := 0; g < 4; g++ {
		for k := 0; k < 4; k++ {
			p("\tVPMOVZXBD %d(SI), Y3", qs+32*g+8*k)
			p("\tVPAND Y15, Y3, Y4")
			p("\tVPSRLD $4, Y3, Y5")
			if q5 {
				// qh[l] for l = 8k..8k+7: bit 2g → element l (+16),
				// bit 2g+1 → element l+32.
				p("\tVPMOVZXBD %d(SI), Y12", 16+8*k)
				shiftTo4(12, 10, 2*g)
				p("\tVPAND Y13, Y10, Y10")
				p("\tVPOR Y10, Y4, Y4")
				shiftTo4(12, 11, 2*g+1)
				p("\tVPAND Y13, Y11, Y11")
				p("\tVPOR Y11, Y5, Y5")
			}
			p("\tVCVTDQ2PS Y4, Y4")
			p("\tVCVTDQ2PS Y5, Y5")
			xl, xh := 256*g+32*k, 256*g+128+32*k
			if k == 0 {
				p("\tVMOVUPS %d(DI), Y8", xl)
				p("\tVMOVUPS %d(DI), Y9", xh)
				p("\tVMULPS Y8, Y4, Y6")
				p("\tVMULPS Y9, Y5, Y7")
			} else {
				p("\tVMOVUPS %d(DI), Y10", xl)
				p("\tVMOVUPS %d(DI), Y11", xh)
				p("\tVFMADD231PS Y10, Y4, Y6")
				p("\tVFMADD231PS Y11, Y5, Y7")
				p("\tVADDPS Y10, Y8, Y8")
				p("\tVADDPS Y11, Y9, Y9")
			}
		}
		p("\tVBROADCASTSS %d(SP), Y10", 8*g)
		p("\tVBROADCASTSS %d(SP), Y11", 8*g+4)
		p("\tVFMADD231PS Y10, Y6, Y0")
		p("\tVFMADD231PS Y11, Y7, Y1")
		p("\tVBROADCASTSS %d(SP), Y10", 32+8*g)
		p("\tVBROADCASTSS %d(SP), Y11", 32+8*g+4)
		p("\tVFMADD231PS Y10, Y8, Y2")
		p("\tVFMADD231PS Y11, Y9, Y14")
	}
	p("\tADDQ $%d, SI", size)
	p("\tADDQ $1024, DI")
	p("\tDECQ CX")
	p("\tJNZ %s_block", name)
	p("%s_done:", name)
	p("\tVADDPS Y1, Y0, Y0")
	p("\tVADDPS Y14, Y2, Y2")
	p("\tVSUBPS Y2, Y0, Y0")
	hsumRet(24)
}

// q6K: n blocks of 210 bytes: ql[128], qh[64], scales[16] int8, d f16.
// The 16 scales times d are parked at 0(SP). For each half (128
// elements) and each 8-element chunk l = 8c.., A = ql[l], B = ql[l+32],
// H = qh[l] give the quants of elements l, l+32, l+64, l+96:
// (A&15)|(H<<4&48), (B&15)|(H<<2&48), (A>>4)|(H&48), (B>>4)|(H>>2&48),
// each −32. Y15 = 15, Y14 = 48, Y13 = 32; Y0, Y1 accumulate.
func q6K() {
	const name = "dotQ6KAVX2"
	header(name, 64, "x", "func dotQ6KAVX2(w *byte, x *float32, n int) float32: n Q6_K blocks.")
	p("\tVXORPS Y0, Y0, Y0")
	p("\tVXORPS Y1, Y1, Y1")
	bcastConst(15, 15)
	bcastConst(14, 48)
	bcastConst(13, 32)
	p("\tTESTQ CX, CX")
	p("\tJZ %s_done", name)
	p("%s_block:", name)
	p("\tMOVWLZX 208(SI), AX")
	p("\tVMOVD AX, X2")
	p("\tVCVTPH2PS X2, X2")
	p("\tVBROADCASTSS X2, Y2")
	p("\tVPMOVSXBD 192(SI), Y3")
	p("\tVPMOVSXBD 200(SI), Y4")
	p("\tVCVTDQ2PS Y3, Y3")
	p("\tVCVTDQ2PS Y4, Y4")
	p("\tVMULPS Y2, Y3, Y3")
	p("\tVMULPS Y2, Y4, Y4")
	p("\tVMOVUPS Y3, 0(SP)")
	p("\tVMOVUPS Y4, 32(SP)")
	part := []int{6, 7, 8, 9} // partial sums of the four quarter rows
	for n := 0; n < 2; n++ {
		for c := 0; c < 4; c++ {
			p("\tVPMOVZXBD %d(SI), Y3", 64*n+8*c)    // A
			p("\tVPMOVZXBD %d(SI), Y4", 64*n+32+8*c) // B
			p("\tVPMOVZXBD %d(SI), Y5", 128+32*n+8*c)
			for e := 0; e < 4; e++ {
				q6Quant(e)
				xo := 4 * (128*n + 8*c + 32*e)
				if c%2 == 0 {
					p("\tVMULPS %d(DI), Y10, Y%d", xo, part[e])
				} else {
					p("\tVFMADD231PS %d(DI), Y10, Y%d", xo, part[e])
				}
			}
			if c%2 == 1 {
				// Sub-blocks 8n + c/2 + 2k for k = 0..3 are complete.
				for k := 0; k < 4; k++ {
					p("\tVBROADCASTSS %d(SP), Y12", 4*(8*n+c/2+2*k))
					p("\tVFMADD231PS Y12, Y%d, Y%d", part[k], k%2)
				}
			}
		}
	}
	p("\tADDQ $210, SI")
	p("\tADDQ $1024, DI")
	p("\tDECQ CX")
	p("\tJNZ %s_block", name)
	p("%s_done:", name)
	p("\tVADDPS Y1, Y0, Y0")
	hsumRet(24)
}

// q32 is the kernel of the 32-element legacy blocks: Q4_0 (d, 16 bytes of
// nibbles, value (q−8)·d), Q4_1 (d, m, nibbles, q·d + m), Q5_0 (d, qh
// uint32, nibbles, (q−16)·d) and Q5_1 (d, m, qh, nibbles, q·d + m). Byte j
// of the nibbles holds element j (low) and j+16 (high); bit e of qh is
// the fifth bit of element e, brought to bit 4 of its lane by VPSRLVD
// with the per-lane counts of q5shifts (from qh<<4 for elements 0-7, qh
// for the rest). Y0 accumulates d·Σq·x, Y1 m·Σx; Y15 = 0x0f, Y14 = 0x10,
// Y13 = the offset (8 or 16).
func q32(name string, size, qs, qh int, withMin bool, offset uint32) {
	header(name, 0, "x", fmt.Sprintf("func %s(w *byte, x *float32, n int) float32: n blocks.", name))
	p("\tVXORPS Y0, Y0, Y0")
	p("\tVXORPS Y1, Y1, Y1")
	bcastConst(15, 0x0f)
	if qh >= 0 {
		bcastConst(14, 0x10)
	}
	if offset != 0 {
		bcastConst(13, offset)
	}
	p("\tTESTQ CX, CX")
	p("\tJZ %s_done", name)
	p("%s_block:", name)
	unpack32(qs, qh, offset)
	p("\tVMULPS 0(DI), Y5, Y5")
	p("\tVMULPS 32(DI), Y6, Y6")
	p("\tVFMADD231PS 64(DI), Y7, Y5")
	p("\tVFMADD231PS 96(DI), Y8, Y6")
	p("\tVADDPS Y6, Y5, Y5")
	if withMin {
		p("\tVMOVUPS 0(DI), Y9")
		p("\tVADDPS 32(DI), Y9, Y9")
		p("\tVMOVUPS 64(DI), Y10")
		p("\tVADDPS 96(DI), Y10, Y10")
		p("\tVADDPS Y10, Y9, Y9")
		p("\tMOVL 0(SI), AX")
		p("\tVMOVD AX, X2")
		p("\tVCVTPH2PS X2, X2")
		p("\tVMOVSHDUP X2, X3")
		p("\tVBROADCASTSS X2, Y2")
		p("\tVBROADCASTSS X3, Y3")
		p("\tVFMADD231PS Y9, Y3, Y1")
	} else {
		p("\tMOVWLZX 0(SI), AX")
		p("\tVMOVD AX, X2")
		p("\tVCVTPH2PS X2, X2")
		p("\tVBROADCASTSS X2, Y2")
	}
	p("\tVFMADD231PS Y5, Y2, Y0")
	p("\tADDQ $%d, SI", size)
	p("\tADDQ $128, DI")
	p("\tDECQ CX")
	p("\tJNZ %s_block", name)
	p("%s_done:", name)
	p("\tVADDPS Y1, Y0, Y0")
	hsumRet(24)
}

// q5shifts are the VPSRLVD counts that bring bit e of qh (of qh<<4 for
// e < 8) to bit 4 of lane e%8 of the vector of elements e/8.
func q5shifts() {
	p("")
	p("// q5shifts: per-lane right shifts for the fifth bits of Q5_0/Q5_1.")
	for e := 0; e < 32; e++ {
		c := e - 4
		if e < 8 {
			c = e
		}
		p("DATA ·q5shifts+%d(SB)/4, $%d", 4*e, c)
	}
	p("GLOBL ·q5shifts(SB), RODATA|NOPTR, $128")
	p("")
	p("// q5shifts512: the same for 16 lanes (elements 0-15 from qh<<4, 16-31 from qh).")
	for e := 0; e < 32; e++ {
		c := e - 4
		if e < 16 {
			c = e
		}
		p("DATA ·q5shifts512+%d(SB)/4, $%d", 4*e, c)
	}
	p("GLOBL ·q5shifts512(SB), RODATA|NOPTR, $128")
}

// The dequantizers: the same unpacking, then each quant converted to
// float32 and scaled with ggml's operations in ggml's order (a multiply,
// then an add or subtract: no fused multiply-add), so the values are
// ggml's bit for bit. DI points at the destination floats.

// dqHalf: F16 or BF16 rows of n elements, n a multiple of 8.
func dqHalf(name string, f16 bool) {
	header(name, 0, "y", fmt.Sprintf("func %s(w *byte, y *float32, n int): n a multiple of 8.", name))
	p("%s_8:", name)
	p("\tTESTQ CX, CX")
	p("\tJZ %s_done", name)
	if f16 {
		p("\tVCVTPH2PS (SI), Y0")
	} else {
		p("\tVPMOVZXWD (SI), Y0")
		p("\tVPSLLD $16, Y0, Y0")
	}
	p("\tVMOVUPS Y0, (DI)")
	p("\tADDQ $16, SI")
	p("\tADDQ $32, DI")
	p("\tSUBQ $8, CX")
	p("\tJMP %s_8", name)
	p("%s_done:", name)
	p("\tVZEROUPPER")
	p("\tRET")
}

func dqQ8_0() {
	const name = "dequantQ8_0AVX2"
	header(name, 0, "y", "func dequantQ8_0AVX2(w *byte, y *float32, n int): n Q8_0 blocks.")
	p("\tTESTQ CX, CX")
	p("\tJZ %s_done", name)
	p("%s_block:", name)
	p("\tMOVWLZX 0(SI), AX")
	p("\tVMOVD AX, X0")
	p("\tVCVTPH2PS X0, X0")
	p("\tVBROADCASTSS X0, Y0")
	for k := 0; k < 4; k++ {
		p("\tVPMOVSXBD %d(SI), Y%d", 2+8*k, 1+k)
		p("\tVCVTDQ2PS Y%d, Y%d", 1+k, 1+k)
		p("\tVMULPS Y0, Y%d, Y%d", 1+k, 1+k)
		p("\tVMOVUPS Y%d, %d(DI)", 1+k, 32*k)
	}
	p("\tADDQ $34, SI")
	p("\tADDQ $128, DI")
	p("\tDECQ CX")
	p("\tJNZ %s_block", name)
	p("%s_done:", name)
	p("\tVZEROUPPER")
	p("\tRET")
}

// unpack32 leaves the integer quants of the 32-element block at SI in
// Y5 (elements 0-7), Y6 (8-15), Y7 (16-23), Y8 (24-31), the offset
// subtracted (registers as in q32).
func unpack32(qs, qh int, offset uint32) {
	p("\tVPMOVZXBD %d(SI), Y3", qs)
	p("\tVPMOVZXBD %d(SI), Y4", qs+8)
	p("\tVPAND Y15, Y3, Y5")
	p("\tVPAND Y15, Y4, Y6")
	p("\tVPSRLD $4, Y3, Y7")
	p("\tVPSRLD $4, Y4, Y8")
	if qh >= 0 {
		p("\tMOVL %d(SI), AX", qh)
		p("\tVMOVD AX, X9")
		p("\tVPBROADCASTD X9, Y9")
		p("\tVPSLLD $4, Y9, Y10")
		for i, r := range []int{5, 6, 7, 8} {
			src := 9
			if i == 0 {
				src = 10
			}
			p("\tVPSRLVD ·q5shifts+%d(SB), Y%d, Y11", 32*i, src)
			p("\tVPAND Y14, Y11, Y11")
			p("\tVPOR Y11, Y%d, Y%d", r, r)
		}
	}
	for _, r := range []int{5, 6, 7, 8} {
		if offset != 0 {
			p("\tVPSUBD Y13, Y%d, Y%d", r, r)
		}
		p("\tVCVTDQ2PS Y%d, Y%d", r, r)
	}
}

func dq32(name string, size, qs, qh int, withMin bool, offset uint32) {
	header(name, 0, "y", fmt.Sprintf("func %s(w *byte, y *float32, n int): n blocks.", name))
	bcastConst(15, 0x0f)
	if qh >= 0 {
		bcastConst(14, 0x10)
	}
	if offset != 0 {
		bcastConst(13, offset)
	}
	p("\tTESTQ CX, CX")
	p("\tJZ %s_done", name)
	p("%s_block:", name)
	unpack32(qs, qh, offset)
	if withMin {
		p("\tMOVL 0(SI), AX")
		p("\tVMOVD AX, X2")
		p("\tVCVTPH2PS X2, X2")
		p("\tVMOVSHDUP X2, X1")
		p("\tVBROADCASTSS X2, Y2")
		p("\tVBROADCASTSS X1, Y1")
	} else {
		p("\tMOVWLZX 0(SI), AX")
		p("\tVMOVD AX, X2")
		p("\tVCVTPH2PS X2, X2")
		p("\tVBROADCASTSS X2, Y2")
	}
	for i, r := range []int{5, 6, 7, 8} {
		p("\tVMULPS Y2, Y%d, Y%d", r, r)
		if withMin {
			p("\tVADDPS Y1, Y%d, Y%d", r, r)
		}
		p("\tVMOVUPS Y%d, %d(DI)", r, 32*i)
	}
	p("\tADDQ $%d, SI", size)
	p("\tADDQ $128, DI")
	p("\tDECQ CX")
	p("\tJNZ %s_block", name)
	p("%s_done:", name)
	p("\tVZEROUPPER")
	p("\tRET")
}

// kScalesInt unpacks the 6-bit scales and mins of the Q4_K/Q5_K block at
// SI with ggml's 32-bit mask trick into sc[0..7] (R8, R10) and m[0..7]
// (R13, R11) and widens them into the int32 lanes of Y3 and Y4 (clobbers
// R8-R13).
func kScalesInt() {
	p("\tMOVL 4(SI), R8")
	p("\tMOVL 8(SI), R9")
	p("\tMOVL 12(SI), R10")
	p("\tMOVL R10, R11")
	p("\tSHRL $4, R11")
	p("\tANDL $0x0f0f0f0f, R11")
	p("\tMOVL R9, R12")
	p("\tSHRL $6, R12")
	p("\tANDL $0x03030303, R12")
	p("\tSHLL $4, R12")
	p("\tORL R12, R11")
	p("\tMOVL R9, R13")
	p("\tANDL $0x3f3f3f3f, R13")
	p("\tANDL $0x0f0f0f0f, R10")
	p("\tMOVL R8, R12")
	p("\tSHRL $6, R12")
	p("\tANDL $0x03030303, R12")
	p("\tSHLL $4, R12")
	p("\tORL R12, R10")
	p("\tANDL $0x3f3f3f3f, R8")
	p("\tVMOVD R8, X3")
	p("\tVPINSRD $1, R10, X3, X3")
	p("\tVMOVD R13, X4")
	p("\tVPINSRD $1, R11, X4, X4")
	p("\tVPMOVZXBD X3, Y3")
	p("\tVPMOVZXBD X4, Y4")
}

// kScales is kScalesInt, then the scales times d and the mins times dmin,
// parked as d·sc[0..7] at 0(SP) and dmin·m[0..7] at 32(SP) for
// VBROADCASTSS (clobbers AX, R8-R13, Y3-Y7).
func kScales() {
	kScalesInt()
	p("\tVCVTDQ2PS Y3, Y3")
	p("\tVCVTDQ2PS Y4, Y4")
	p("\tMOVL 0(SI), AX")
	p("\tVMOVD AX, X5")
	p("\tVCVTPH2PS X5, X5")
	p("\tVBROADCASTSS X5, Y6")
	p("\tVMOVSHDUP X5, X7")
	p("\tVBROADCASTSS X7, Y7")
	p("\tVMULPS Y6, Y3, Y3")
	p("\tVMULPS Y7, Y4, Y4")
	p("\tVMOVUPS Y3, 0(SP)")
	p("\tVMOVUPS Y4, 32(SP)")
}

func dqK4(q5 bool) {
	name, size, qs := "dequantQ4KAVX2", 144, 16
	if q5 {
		name, size, qs = "dequantQ5KAVX2", 176, 48
	}
	header(name, 64, "y", fmt.Sprintf("func %s(w *byte, y *float32, n int): n blocks.", name))
	bcastConst(15, 0x0f)
	if q5 {
		bcastConst(13, 0x10)
	}
	p("\tTESTQ CX, CX")
	p("\tJZ %s_done", name)
	p("%s_block:", name)
	kScales()
	for g := 0; g < 4; g++ {
		p("\tVBROADCASTSS %d(SP), Y0", 8*g)
		p("\tVBROADCASTSS %d(SP), Y1", 8*g+4)
		p("\tVBROADCASTSS %d(SP), Y2", 32+8*g)
		p("\tVBROADCASTSS %d(SP), Y14", 32+8*g+4)
		for k := 0; k < 4; k++ {
			p("\tVPMOVZXBD %d(SI), Y3", qs+32*g+8*k)
			p("\tVPAND Y15, Y3, Y4")
			p("\tVPSRLD $4, Y3, Y5")
			if q5 {
				p("\tVPMOVZXBD %d(SI), Y12", 16+8*k)
				shiftTo4(12, 10, 2*g)
				p("\tVPAND Y13, Y10, Y10")
				p("\tVPOR Y10, Y4, Y4")
				shiftTo4(12, 11, 2*g+1)
				p("\tVPAND Y13, Y11, Y11")
				p("\tVPOR Y11, Y5, Y5")
			}
			p("\tVCVTDQ2PS Y4, Y4")
			p("\tVCVTDQ2PS Y5, Y5")
			p("\tVMULPS Y0, Y4, Y4")
			p("\tVMULPS Y1, Y5, Y5")
			p("\tVSUBPS Y2, Y4, Y4")
			p("\tVSUBPS Y14, Y5, Y5")
			p("\tVMOVUPS Y4, %d(DI)", 256*g+32*k)
			p("\tVMOVUPS Y5, %d(DI)", 256*g+128+32*k)
		}
	}
	p("\tADDQ $%d, SI", size)
	p("\tADDQ $1024, DI")
	p("\tDECQ CX")
	p("\tJNZ %s_block", name)
	p("%s_done:", name)
	p("\tVZEROUPPER")
	p("\tRET")
}

// q6Quants leaves in Y10 the float quants (−32 applied) of quarter e of
// chunk (n, c) of the Q6_K block at SI, with A, B, H in Y3, Y4, Y5
// (registers as in q6K).
func q6Quant(e int) {
	src := []int{3, 4, 3, 4}[e]
	if e < 2 {
		p("\tVPAND Y15, Y%d, Y10", src)
	} else {
		p("\tVPSRLD $4, Y%d, Y10", src)
	}
	switch e {
	case 0:
		p("\tVPSLLD $4, Y5, Y11")
		p("\tVPAND Y14, Y11, Y11")
	case 1:
		p("\tVPSLLD $2, Y5, Y11")
		p("\tVPAND Y14, Y11, Y11")
	case 2:
		p("\tVPAND Y14, Y5, Y11")
	case 3:
		p("\tVPSRLD $2, Y5, Y11")
		p("\tVPAND Y14, Y11, Y11")
	}
	p("\tVPOR Y11, Y10, Y10")
	p("\tVPSUBD Y13, Y10, Y10")
	p("\tVCVTDQ2PS Y10, Y10")
}

func dqQ6K() {
	const name = "dequantQ6KAVX2"
	header(name, 64, "y", "func dequantQ6KAVX2(w *byte, y *float32, n int): n Q6_K blocks.")
	bcastConst(15, 15)
	bcastConst(14, 48)
	bcastConst(13, 32)
	p("\tTESTQ CX, CX")
	p("\tJZ %s_done", name)
	p("%s_block:", name)
	p("\tMOVWLZX 208(SI), AX")
	p("\tVMOVD AX, X2")
	p("\tVCVTPH2PS X2, X2")
	p("\tVBROADCASTSS X2, Y2")
	p("\tVPMOVSXBD 192(SI), Y3")
	p("\tVPMOVSXBD 200(SI), Y4")
	p("\tVCVTDQ2PS Y3, Y3")
	p("\tVCVTDQ2PS Y4, Y4")
	p("\tVMULPS Y2, Y3, Y3")
	p("\tVMULPS Y2, Y4, Y4")
	p("\tVMOVUPS Y3, 0(SP)")
	p("\tVMOVUPS Y4, 32(SP)")
	for n := 0; n < 2; n++ {
		for c := 0; c < 4; c++ {
			p("\tVPMOVZXBD %d(SI), Y3", 64*n+8*c)
			p("\tVPMOVZXBD %d(SI), Y4", 64*n+32+8*c)
			p("\tVPMOVZXBD %d(SI), Y5", 128+32*n+8*c)
			for e := 0; e < 4; e++ {
				q6Quant(e)
				p("\tVBROADCASTSS %d(SP), Y12", 4*(8*n+c/2+2*e))
				p("\tVMULPS Y12, Y10, Y10")
				p("\tVMOVUPS Y10, %d(DI)", 4*(128*n+32*e+8*c))
			}
		}
	}
	p("\tADDQ $210, SI")
	p("\tADDQ $1024, DI")
	p("\tDECQ CX")
	p("\tJNZ %s_block", name)
	p("%s_done:", name)
	p("\tVZEROUPPER")
	p("\tRET")
}

// The AVX-512 dot kernels: the same schemes on 16-lane zmm vectors
// (VPMOVZXBD widens 16 bytes at a time), named …AVX512.

// zConst sets every int32 lane of Z(reg) to v (clobbers AX).
func zConst(reg int, v uint32) {
	p("\tMOVL $0x%08x, AX", v)
	p("\tVMOVD AX, X%d", reg)
	p("\tVPBROADCASTD X%d, Z%d", reg, reg)
}

// zHsumRet reduces Z0 and returns it at ret.
func zHsumRet(ret int) {
	p("\tVEXTRACTF64X4 $1, Z0, Y1")
	p("\tVADDPS Y1, Y0, Y0")
	hsumRet(ret)
}

// zHalf: F16 or BF16 rows, n a multiple of 16, 64 per iteration. The Many
// form asks for its rows streamAhead bytes on (PREFETCHNTA, see
// streamAhead); on an earlier AMD EPYC (Zen 4 class) two PREFETCHT0 per
// 128 bytes, 1 KiB ahead, had halved the rows' rate from memory
// (BenchmarkDotManyStream F16: 11 against 23 GB/s on one core).

func zHalf(name string, f16, many bool) {
	if many {
		p("")
		p("// func %s(ws *[]byte, x *float32, n, rows int, out *float32): rows > 0, n a multiple of 16.", name)
		p("TEXT ·%s(SB), NOSPLIT, $24-40", name)
		aheadStart()
		manyStart(name, 24, 32)
		p("\tMOVQ x+8(FP), DI")
		p("\tMOVQ n+16(FP), CX")
	} else {
		header(name, 0, "x", fmt.Sprintf("func %s(w *byte, x *float32, n int) float32: n a multiple of 16.", name))
	}
	for i := 0; i < 4; i++ {
		p("\tVPXORD Z%d, Z%d, Z%d", i, i, i)
	}
	load := func(off, reg int) {
		if f16 {
			p("\tVCVTPH2PS %d(SI), Z%d", off, reg)
		} else {
			p("\tVPMOVZXWD %d(SI), Z%d", off, reg)
			p("\tVPSLLD $16, Z%d, Z%d", reg, reg)
		}
	}
	p("%s_64:", name)
	p("\tCMPQ CX, $64")
	p("\tJLT %s_16", name)
	if many {
		ahead(128)
	}
	for i := 0; i < 4; i++ {
		load(32*i, 4+i)
	}
	for i := 0; i < 4; i++ {
		p("\tVFMADD231PS %d(DI), Z%d, Z%d", 64*i, 4+i, i)
	}
	p("\tADDQ $128, SI")
	p("\tADDQ $256, DI")
	p("\tSUBQ $64, CX")
	p("\tJMP %s_64", name)
	p("%s_16:", name)
	p("\tTESTQ CX, CX")
	p("\tJZ %s_done", name)
	load(0, 4)
	p("\tVFMADD231PS (DI), Z4, Z0")
	p("\tADDQ $32, SI")
	p("\tADDQ $64, DI")
	p("\tSUBQ $16, CX")
	p("\tJMP %s_16", name)
	p("%s_done:", name)
	p("\tVADDPS Z1, Z0, Z0")
	p("\tVADDPS Z3, Z2, Z2")
	p("\tVADDPS Z2, Z0, Z0")
	if many {
		p("\tVEXTRACTF64X4 $1, Z0, Y1")
		p("\tVADDPS Y1, Y0, Y0")
		hsumNext(name)
		return
	}
	zHsumRet(24)
}

// zHalfTile: a tile of W (4 or 2) F16 or BF16 weight rows (read from W
// consecutive slice headers at ws) against r activation rows (a, rows lda
// floats apart; r from 1 to maxR, the argument r picking the loop), k a
// multiple of 16 and positive: out[i*4+j] = row j · activation row i.
// Per 16 columns each weight vector is converted once and feeds r FMAs,
// so a decode batch needs no dequantized copy of the weights (W·r ≤ 16
// accumulators). With prefetch, each iteration also prefetches the W·32
// bytes at next + W·(its offset): W·(row bytes) from next, the next tile's
// rows when they lie back to back, are in the cache when its call starts.
// Rows shorter than 2 KiB need it (at 576–960 columns the hardware
// prefetcher leaves a tile waiting on memory, see DotTile).
func zHalfTile(name string, f16 bool, W, maxR int, prefetch bool) {
	p("")
	p("// func %s(ws *[]byte, a *float32, lda, k int, out *float32, next *byte, r int): %d weight rows, 1 to %d activation rows, k a positive multiple of 16.", name, W, maxR)
	p("TEXT ·%s(SB), NOSPLIT, $0-56", name)
	p("\tMOVQ ws+0(FP), AX")
	wreg := []string{"R10", "R11", "R12", "R13"}[:W]
	for j, r := range wreg {
		p("\tMOVQ %d(AX), %s", 24*j, r)
	}
	p("\tMOVQ next+40(FP), AX")
	p("\tMOVQ a+8(FP), SI")
	p("\tMOVQ lda+16(FP), R8")
	p("\tSHLQ $2, R8")
	p("\tLEAQ (R8)(R8*2), R9")
	if maxR > 4 {
		p("\tLEAQ (SI)(R8*4), BX")
	}
	p("\tMOVQ out+32(FP), DI")
	p("\tMOVQ r+48(FP), CX")
	for R := 1; R < maxR; R++ {
		p("\tCMPQ CX, $%d", R)
		p("\tJEQ %s_r%d", name, R)
	}
	p("\tJMP %s_r%d", name, maxR)
	arow := []string{"(SI)", "(SI)(R8*1)", "(SI)(R8*2)", "(SI)(R9*1)", "(BX)", "(BX)(R8*1)", "(BX)(R8*2)", "(BX)(R9*1)"}
	for R := 1; R <= maxR; R++ {
		p("%s_r%d:", name, R)
		p("\tMOVQ k+24(FP), CX")
		p("\tSHRQ $4, CX")
		p("\tXORQ DX, DX")
		for i := range W * R {
			p("\tVPXORD Z%d, Z%d, Z%d", i, i, i)
		}
		p("%s_r%dloop:", name, R)
		if prefetch {
			switch W {
			case 2:
				p("\tPREFETCHT0 (AX)(DX*2)")
			case 4:
				p("\tPREFETCHT0 (AX)(DX*4)")
				p("\tPREFETCHT0 64(AX)(DX*4)")
			}
		}
		for j, r := range wreg {
			if f16 {
				p("\tVCVTPH2PS (%s)(DX*1), Z%d", r, 16+j)
			} else {
				p("\tVPMOVZXWD (%s)(DX*1), Z%d", r, 16+j)
				p("\tVPSLLD $16, Z%d, Z%d", 16+j, 16+j)
			}
		}
		for i := range R {
			p("\tVMOVUPS %s, Z%d", arow[i], 20+i%4)
			for j := range W {
				p("\tVFMADD231PS Z%d, Z%d, Z%d", 16+j, 20+i%4, i*W+j)
			}
		}
		p("\tADDQ $32, DX")
		p("\tADDQ $64, SI")
		if R > 4 {
			p("\tADDQ $64, BX")
		}
		p("\tDECQ CX")
		p("\tJNZ %s_r%dloop", name, R)
		for i := range R {
			for j := range W {
				r := i*W + j
				p("\tVEXTRACTF64X4 $1, Z%d, Y24", r)
				p("\tVADDPS Y24, Y%d, Y%d", r, r)
				p("\tVEXTRACTF32X4 $1, Y%d, X24", r)
				p("\tVADDPS X24, X%d, X%d", r, r)
				p("\tVHADDPS X%d, X%d, X%d", r, r, r)
				p("\tVHADDPS X%d, X%d, X%d", r, r, r)
				p("\tVMOVSS X%d, %d(DI)", r, 4*(i*4+j))
			}
		}
		p("\tVZEROUPPER")
		p("\tRET")
	}
}

// zHalfScale broadcasts the f16 at off(SI) into Z(reg).
func zHalfScale(off, reg int) {
	p("\tMOVWLZX %d(SI), AX", off)
	p("\tVMOVD AX, X%d", reg)
	p("\tVCVTPH2PS X%d, X%d", reg, reg)
	p("\tVBROADCASTSS X%d, Z%d", reg, reg)
}

// zQ8_0: two Q8_0 blocks per iteration into Z0 and Z1.
func zQ8_0() {
	const name = "dotQ8_0AVX512"
	header(name, 0, "x", "func dotQ8_0AVX512(w *byte, x *float32, n int) float32: n Q8_0 blocks.")
	p("\tVPXORD Z0, Z0, Z0")
	p("\tVPXORD Z1, Z1, Z1")
	block := func(off, xoff, acc, t int) {
		zHalfScale(off, t)
		p("\tVPMOVSXBD %d(SI), Z%d", off+2, t+1)
		p("\tVPMOVSXBD %d(SI), Z%d", off+18, t+2)
		p("\tVCVTDQ2PS Z%d, Z%d", t+1, t+1)
		p("\tVCVTDQ2PS Z%d, Z%d", t+2, t+2)
		p("\tVMULPS %d(DI), Z%d, Z%d", xoff, t+1, t+1)
		p("\tVFMADD231PS %d(DI), Z%d, Z%d", xoff+64, t+2, t+1)
		p("\tVFMADD231PS Z%d, Z%d, Z%d", t+1, t, acc)
	}
	p("%s_2:", name)
	p("\tCMPQ CX, $2")
	p("\tJLT %s_1", name)
	block(0, 0, 0, 2)
	block(34, 128, 1, 5)
	p("\tADDQ $68, SI")
	p("\tADDQ $256, DI")
	p("\tSUBQ $2, CX")
	p("\tJMP %s_2", name)
	p("%s_1:", name)
	p("\tTESTQ CX, CX")
	p("\tJZ %s_done", name)
	block(0, 0, 0, 2)
	p("%s_done:", name)
	p("\tVADDPS Z1, Z0, Z0")
	zHsumRet(24)
}

// zQ32: the 32-element legacy blocks (see q32): the 16 nibble bytes widen
// to one vector whose low nibbles are elements 0-15 and high nibbles
// 16-31; the fifth bits come from qh<<4 (elements 0-15) and qh (16-31)
// by the counts of q5shifts512. Z15 = 0x0f, Z14 = 0x10, Z13 = offset.
func zQ32(name string, size, qs, qh int, withMin bool, offset uint32) {
	header(name, 0, "x", fmt.Sprintf("func %s(w *byte, x *float32, n int) float32: n blocks.", name))
	p("\tVPXORD Z0, Z0, Z0")
	p("\tVPXORD Z1, Z1, Z1")
	zConst(15, 0x0f)
	if qh >= 0 {
		zConst(14, 0x10)
	}
	if offset != 0 {
		zConst(13, offset)
	}
	p("\tTESTQ CX, CX")
	p("\tJZ %s_done", name)
	p("%s_block:", name)
	p("\tVPMOVZXBD %d(SI), Z3", qs)
	p("\tVPANDD Z15, Z3, Z5")
	p("\tVPSRLD $4, Z3, Z6")
	if qh >= 0 {
		p("\tMOVL %d(SI), AX", qh)
		p("\tVMOVD AX, X9")
		p("\tVPBROADCASTD X9, Z9")
		p("\tVPSLLD $4, Z9, Z10")
		p("\tVPSRLVD ·q5shifts512+0(SB), Z10, Z11")
		p("\tVPANDD Z14, Z11, Z11")
		p("\tVPORD Z11, Z5, Z5")
		p("\tVPSRLVD ·q5shifts512+64(SB), Z9, Z11")
		p("\tVPANDD Z14, Z11, Z11")
		p("\tVPORD Z11, Z6, Z6")
	}
	for _, r := range []int{5, 6} {
		if offset != 0 {
			p("\tVPSUBD Z13, Z%d, Z%d", r, r)
		}
		p("\tVCVTDQ2PS Z%d, Z%d", r, r)
	}
	p("\tVMULPS 0(DI), Z5, Z5")
	p("\tVFMADD231PS 64(DI), Z6, Z5")
	if withMin {
		p("\tVMOVUPS 0(DI), Z9")
		p("\tVADDPS 64(DI), Z9, Z9")
		p("\tMOVL 0(SI), AX")
		p("\tVMOVD AX, X2")
		p("\tVCVTPH2PS X2, X2")
		p("\tVMOVSHDUP X2, X3")
		p("\tVBROADCASTSS X2, Z2")
		p("\tVBROADCASTSS X3, Z3")
		p("\tVFMADD231PS Z9, Z3, Z1")
	} else {
		zHalfScale(0, 2)
	}
	p("\tVFMADD231PS Z5, Z2, Z0")
	p("\tADDQ $%d, SI", size)
	p("\tADDQ $128, DI")
	p("\tDECQ CX")
	p("\tJNZ %s_block", name)
	p("%s_done:", name)
	p("\tVADDPS Z1, Z0, Z0")
	zHsumRet(24)
}

// zShiftTo4 is shiftTo4 on zmm registers.
func zShiftTo4(src, dst, b int) {
	switch {
	case b < 4:
		p("\tVPSLLD $%d, Z%d, Z%d", 4-b, src, dst)
	case b > 4:
		p("\tVPSRLD $%d, Z%d, Z%d", b-4, src, dst)
	default:
		p("\tVMOVDQU32 Z%d, Z%d", src, dst)
	}
}

// zQ4K: Q4_K/Q5_K (see q4K), two 16-byte chunks per 64-element group.
// Z0, Z1 accumulate d·sc·Σq·x, Z2, Z16 dmin·m·Σx.
func zQ4K(q5 bool) {
	name, size, qs := "dotQ4KAVX512", 144, 16
	if q5 {
		name, size, qs = "dotQ5KAVX512", 176, 48
	}
	header(name, 64, "x", fmt.Sprintf("func %s(w *byte, x *float32, n int) float32: n blocks.", name))
	for _, r := range []int{0, 1, 2, 16} {
		p("\tVPXORD Z%d, Z%d, Z%d", r, r, r)
	}
	zConst(15, 0x0f)
	if q5 {
		zConst(13, 0x10)
	}
	p("\tTESTQ CX, CX")
	p("\tJZ %s_done", name)
	p("%s_block:", name)
	kScales()
	for g := 0; g < 4; g++ {
		for k := 0; k < 2; k++ {
			p("\tVPMOVZXBD %d(SI), Z3", qs+32*g+16*k)
			p("\tVPANDD Z15, Z3, Z4")
			p("\tVPSRLD $4, Z3, Z5")
			if q5 {
				p("\tVPMOVZXBD %d(SI), Z12", 16+16*k)
				zShiftTo4(12, 10, 2*g)
				p("\tVPANDD Z13, Z10, Z10")
				p("\tVPORD Z10, Z4, Z4")
				zShiftTo4(12, 11, 2*g+1)
				p("\tVPANDD Z13, Z11, Z11")
				p("\tVPORD Z11, Z5, Z5")
			}
			p("\tVCVTDQ2PS Z4, Z4")
			p("\tVCVTDQ2PS Z5, Z5")
			xl, xh := 256*g+64*k, 256*g+128+64*k
			if k == 0 {
				p("\tVMOVUPS %d(DI), Z8", xl)
				p("\tVMOVUPS %d(DI), Z9", xh)
				p("\tVMULPS Z8, Z4, Z6")
				p("\tVMULPS Z9, Z5, Z7")
			} else {
				p("\tVMOVUPS %d(DI), Z10", xl)
				p("\tVMOVUPS %d(DI), Z11", xh)
				p("\tVFMADD231PS Z10, Z4, Z6")
				p("\tVFMADD231PS Z11, Z5, Z7")
				p("\tVADDPS Z10, Z8, Z8")
				p("\tVADDPS Z11, Z9, Z9")
			}
		}
		p("\tVBROADCASTSS %d(SP), Z10", 8*g)
		p("\tVBROADCASTSS %d(SP), Z11", 8*g+4)
		p("\tVFMADD231PS Z10, Z6, Z0")
		p("\tVFMADD231PS Z11, Z7, Z1")
		p("\tVBROADCASTSS %d(SP), Z10", 32+8*g)
		p("\tVBROADCASTSS %d(SP), Z11", 32+8*g+4)
		p("\tVFMADD231PS Z10, Z8, Z2")
		p("\tVFMADD231PS Z11, Z9, Z16")
	}
	p("\tADDQ $%d, SI", size)
	p("\tADDQ $1024, DI")
	p("\tDECQ CX")
	p("\tJNZ %s_block", name)
	p("%s_done:", name)
	p("\tVADDPS Z1, Z0, Z0")
	p("\tVADDPS Z16, Z2, Z2")
	p("\tVSUBPS Z2, Z0, Z0")
	zHsumRet(24)
}

// zQ6K: Q6_K (see q6K) with 16-element chunks, each one whole sub-block:
// the quants are multiplied by x, then the product by the sub-block's
// scale into one of four accumulators Z0, Z1, Z2, Z16.
func zQ6K() {
	const name = "dotQ6KAVX512"
	header(name, 64, "x", "func dotQ6KAVX512(w *byte, x *float32, n int) float32: n Q6_K blocks.")
	accs := []int{0, 1, 2, 16}
	for _, r := range accs {
		p("\tVPXORD Z%d, Z%d, Z%d", r, r, r)
	}
	zConst(15, 15)
	zConst(14, 48)
	zConst(13, 32)
	p("\tTESTQ CX, CX")
	p("\tJZ %s_done", name)
	p("%s_block:", name)
	p("\tMOVWLZX 208(SI), AX")
	p("\tVMOVD AX, X6")
	p("\tVCVTPH2PS X6, X6")
	p("\tVBROADCASTSS X6, Y6")
	p("\tVPMOVSXBD 192(SI), Y3")
	p("\tVPMOVSXBD 200(SI), Y4")
	p("\tVCVTDQ2PS Y3, Y3")
	p("\tVCVTDQ2PS Y4, Y4")
	p("\tVMULPS Y6, Y3, Y3")
	p("\tVMULPS Y6, Y4, Y4")
	p("\tVMOVUPS Y3, 0(SP)")
	p("\tVMOVUPS Y4, 32(SP)")
	for n := 0; n < 2; n++ {
		for c := 0; c < 2; c++ {
			p("\tVPMOVZXBD %d(SI), Z3", 64*n+16*c)
			p("\tVPMOVZXBD %d(SI), Z4", 64*n+32+16*c)
			p("\tVPMOVZXBD %d(SI), Z5", 128+32*n+16*c)
			for e := 0; e < 4; e++ {
				src := []int{3, 4, 3, 4}[e]
				if e < 2 {
					p("\tVPANDD Z15, Z%d, Z10", src)
				} else {
					p("\tVPSRLD $4, Z%d, Z10", src)
				}
				switch e {
				case 0:
					p("\tVPSLLD $4, Z5, Z11")
					p("\tVPANDD Z14, Z11, Z11")
				case 1:
					p("\tVPSLLD $2, Z5, Z11")
					p("\tVPANDD Z14, Z11, Z11")
				case 2:
					p("\tVPANDD Z14, Z5, Z11")
				case 3:
					p("\tVPSRLD $2, Z5, Z11")
					p("\tVPANDD Z14, Z11, Z11")
				}
				p("\tVPORD Z11, Z10, Z10")
				p("\tVPSUBD Z13, Z10, Z10")
				p("\tVCVTDQ2PS Z10, Z10")
				p("\tVMULPS %d(DI), Z10, Z10", 4*(128*n+32*e+16*c))
				p("\tVBROADCASTSS %d(SP), Z12", 4*(8*n+c+2*e))
				p("\tVFMADD231PS Z12, Z10, Z%d", accs[e])
			}
		}
	}
	p("\tADDQ $210, SI")
	p("\tADDQ $1024, DI")
	p("\tDECQ CX")
	p("\tJNZ %s_block", name)
	p("%s_done:", name)
	p("\tVADDPS Z1, Z0, Z0")
	p("\tVADDPS Z16, Z2, Z2")
	p("\tVADDPS Z2, Z0, Z0")
	zHsumRet(24)
}

// zQ4KQ8K: a Q4_K row dotted with activations quantized to Q8_K, in
// integers as llama.cpp's ggml_vec_dot_q4_K_q8_K does, with AVX-512 VNNI:
// per 128 weights one 64-byte load of nibbles, split into low and high
// nibbles (unsigned), each dotted by VPDPBUSD with 64 signed activation
// bytes (stored by the caller in the order [0..31, 64..95, 32..63,
// 96..127] of each 128, so the low nibbles of bytes 0-63 meet x[0..31] and
// x[64..95]); lanes 0-7 of an accumulator hold one sub-block, 8-15 the
// next-but-one, and are multiplied by their 6-bit scales (VPERMD of the
// eight scales by q4kq8kIdx); the mins meet the activations' per-32 sums.
// Z0 accumulates d·dx·Σ sc·Σq·qx, Y1 dmin·dx·m·sums.
func zQ4KQ8K(many bool) {
	name := "dotQ4KQ8KVNNI"
	p("")
	if many {
		name = "dotQ4KQ8KManyVNNI"
		p("// func %s(ws *[]byte, q *int8, d *float32, sums *int32, n, rows int, out *float32): rows > 0, n Q4_K blocks each.", name)
		p("TEXT ·%s(SB), NOSPLIT, $24-56", name)
		aheadStart()
	} else {
		p("// func %s(w *byte, q *int8, d *float32, sums *int32, n int) float32: n Q4_K blocks.", name)
		p("TEXT ·%s(SB), NOSPLIT, $0-44", name)
	}
	zConst(6, 0x0f0f0f0f)
	for i := range 4 {
		p("\tVMOVDQU32 ·q4kq8kIdx+%d(SB), Z%d", 64*i, 16+i)
	}
	intArgs(name, many, "sums", "DX")
	p("\tVPXORD Z0, Z0, Z0")
	p("\tVPXORD Z1, Z1, Z1")
	p("\tTESTQ CX, CX")
	p("\tJZ %s_done", name)
	p("%s_block:", name)
	if many {
		ahead(144)
	}
	kScalesInt()
	// d·dx and dmin·dx.
	p("\tMOVL 0(SI), AX")
	p("\tVMOVD AX, X5")
	p("\tVCVTPH2PS X5, X5")
	p("\tVBROADCASTSS (BX), X7")
	p("\tVMULPS X7, X5, X5")
	p("\tVBROADCASTSS X5, Z20")
	p("\tVMOVSHDUP X5, X7")
	p("\tVBROADCASTSS X7, Y21")
	// The mins against the sums.
	p("\tVPMULLD (DX), Y4, Y15")
	p("\tVCVTDQ2PS Y15, Y15")
	p("\tVFMADD231PS Y21, Y15, Y1")
	// The scales per lane.
	for i := range 4 {
		p("\tVPERMD Z3, Z%d, Z%d", 16+i, 11+i)
	}
	for h := range 2 {
		lo, hi := 22+2*h, 23+2*h
		p("\tVMOVDQU64 %d(SI), Z7", 16+64*h)
		p("\tVPANDD Z6, Z7, Z8")
		p("\tVPSRLD $4, Z7, Z9")
		p("\tVPANDD Z6, Z9, Z9")
		p("\tVPXORD Z%d, Z%d, Z%d", lo, lo, lo)
		p("\tVPXORD Z%d, Z%d, Z%d", hi, hi, hi)
		p("\tVPDPBUSD %d(DI), Z8, Z%d", 128*h, lo)
		p("\tVPDPBUSD %d(DI), Z9, Z%d", 128*h+64, hi)
	}
	for i := range 4 {
		p("\tVPMULLD Z%d, Z%d, Z%d", 11+i, 22+i, 22+i)
	}
	p("\tVPADDD Z23, Z22, Z22")
	p("\tVPADDD Z25, Z24, Z24")
	p("\tVPADDD Z24, Z22, Z22")
	p("\tVCVTDQ2PS Z22, Z22")
	p("\tVFMADD231PS Z20, Z22, Z0")
	p("\tADDQ $144, SI")
	p("\tADDQ $256, DI")
	p("\tADDQ $4, BX")
	p("\tADDQ $32, DX")
	p("\tDECQ CX")
	p("\tJNZ %s_block", name)
	p("%s_done:", name)
	p("\tVEXTRACTF64X4 $1, Z0, Y2")
	p("\tVADDPS Y2, Y0, Y0")
	p("\tVSUBPS Y1, Y0, Y0")
	if many {
		hsumNext(name)
		return
	}
	hsumRet(40)
	p("")
	p("// q4kq8kIdx: the VPERMD indices that spread the eight Q4_K scales over")
	p("// the lanes of dotQ4KQ8KVNNI's four accumulators (sub-blocks 0|2, 1|3,")
	p("// 4|6, 5|7).")
	for i, pair := range [][2]int{{0, 2}, {1, 3}, {4, 6}, {5, 7}} {
		for l := range 16 {
			v := pair[0]
			if l >= 8 {
				v = pair[1]
			}
			p("DATA ·q4kq8kIdx+%d(SB)/4, $%d", 64*i+4*l, v)
		}
	}
	p("GLOBL ·q4kq8kIdx(SB), RODATA|NOPTR, $256")
}

// zQ6KQ8K: a Q6_K row dotted with Q8_K activations in integers with
// AVX-512 VNNI (llama.cpp's ggml_vec_dot_q6_K_q8_K). Per 128 weights: 64
// bytes of low bits split into nibbles, the 32 bytes of high bits
// broadcast to both halves and shifted per half by VPSRLVQ (0|2 for the
// low nibbles, 4|6 for the high), giving unsigned 6-bit values whose
// order is the activations' natural order; VPDPBUSD against them, each
// lane times its 16-element sub-block's signed scale; the −32 offset as
// 32·Σ scale·(sum of the sub-block's activations).
func zQ6KQ8K(many bool) {
	name := "dotQ6KQ8KVNNI"
	p("")
	if many {
		name = "dotQ6KQ8KManyVNNI"
		p("// func %s(ws *[]byte, q *int8, d *float32, sums16 *int32, n, rows int, out *float32): rows > 0, n Q6_K blocks each.", name)
		p("TEXT ·%s(SB), NOSPLIT, $24-56", name)
		aheadStart()
	} else {
		p("// func %s(w *byte, q *int8, d *float32, sums16 *int32, n int) float32: n Q6_K blocks.", name)
		p("TEXT ·%s(SB), NOSPLIT, $0-44", name)
	}
	zConst(6, 0x0f0f0f0f)
	zConst(17, 0x03030303)
	p("\tVMOVDQU64 ·q6kq8kShift+0(SB), Z16")
	p("\tVMOVDQU64 ·q6kq8kShift+64(SB), Z18")
	for i := range 4 {
		p("\tVMOVDQU32 ·q6kq8kIdx+%d(SB), Z%d", 64*i, 26+i)
	}
	intArgs(name, many, "sums16", "DX")
	p("\tVPXORD Z0, Z0, Z0")
	p("\tTESTQ CX, CX")
	p("\tJZ %s_done", name)
	p("%s_block:", name)
	if many {
		ahead(210)
	}
	p("\tVPMOVSXBD 192(SI), Z3")
	p("\tVPMULLD (DX), Z3, Z15")
	p("\tVPSLLD $5, Z15, Z15")
	p("\tMOVWLZX 208(SI), AX")
	p("\tVMOVD AX, X5")
	p("\tVCVTPH2PS X5, X5")
	p("\tVMULSS (BX), X5, X5")
	p("\tVBROADCASTSS X5, Z20")
	p("\tVPXORD Z22, Z22, Z22")
	for n := range 2 {
		p("\tVMOVDQU64 %d(SI), Z7", 64*n)
		p("\tVBROADCASTI64X4 %d(SI), Z10", 128+32*n)
		p("\tVPANDD Z6, Z7, Z8")
		p("\tVPSRLVQ Z16, Z10, Z11")
		p("\tVPANDD Z17, Z11, Z11")
		p("\tVPSLLW $4, Z11, Z11")
		p("\tVPORD Z11, Z8, Z8")
		p("\tVPSRLW $4, Z7, Z9")
		p("\tVPANDD Z6, Z9, Z9")
		p("\tVPSRLVQ Z18, Z10, Z12")
		p("\tVPANDD Z17, Z12, Z12")
		p("\tVPSLLW $4, Z12, Z12")
		p("\tVPORD Z12, Z9, Z9")
		p("\tVPXORD Z24, Z24, Z24")
		p("\tVPXORD Z25, Z25, Z25")
		p("\tVPDPBUSD %d(DI), Z8, Z24", 128*n)
		p("\tVPDPBUSD %d(DI), Z9, Z25", 128*n+64)
		p("\tVPERMD Z3, Z%d, Z13", 26+2*n)
		p("\tVPMULLD Z13, Z24, Z24")
		p("\tVPERMD Z3, Z%d, Z14", 27+2*n)
		p("\tVPMULLD Z14, Z25, Z25")
		p("\tVPADDD Z24, Z22, Z22")
		p("\tVPADDD Z25, Z22, Z22")
	}
	p("\tVPSUBD Z15, Z22, Z22")
	p("\tVCVTDQ2PS Z22, Z22")
	p("\tVFMADD231PS Z20, Z22, Z0")
	p("\tADDQ $210, SI")
	p("\tADDQ $256, DI")
	p("\tADDQ $4, BX")
	p("\tADDQ $64, DX")
	p("\tDECQ CX")
	p("\tJNZ %s_block", name)
	p("%s_done:", name)
	p("\tVEXTRACTF64X4 $1, Z0, Y2")
	p("\tVADDPS Y2, Y0, Y0")
	if many {
		hsumNext(name)
		return
	}
	hsumRet(40)
	p("")
	p("// q6kq8kShift: the VPSRLVQ counts of dotQ6KQ8KVNNI (0|2, 4|6 per half).")
	for i, pair := range [][2]int{{0, 2}, {4, 6}} {
		for l := range 8 {
			v := pair[0]
			if l >= 4 {
				v = pair[1]
			}
			p("DATA ·q6kq8kShift+%d(SB)/8, $%d", 64*i+8*l, v)
		}
	}
	p("GLOBL ·q6kq8kShift(SB), RODATA|NOPTR, $128")
	p("")
	p("// q6kq8kIdx: the VPERMD indices giving each lane of dotQ6KQ8KVNNI's")
	p("// accumulators its 16-element sub-block's scale.")
	for i := range 4 {
		for l := range 16 {
			p("DATA ·q6kq8kIdx+%d(SB)/4, $%d", 64*i+4*l, 4*i+l/4)
		}
	}
	p("GLOBL ·q6kq8kIdx(SB), RODATA|NOPTR, $256")
}

// vbmi switches q80Weights (and the constants zQ80 sets) to the AVX-512
// VBMI + BITALG unpacking of the nibble formats: the pair of blocks read
// by one masked load, its nibbles put in place by one VPERMB and one
// VPSRLVW, and Q5_0's fifth bits turned into a mask by VPERMB and
// VPSHUFBITQMB instead of scalar loads and KMOVQ.
var vbmi bool

// vbmiConsts sets the VBMI path's constants for blocks of size bytes (qs,
// qh as zQ80's): Z20 the nibble bytes' VPERMB indices, Z21 VPSRLVW's
// counts (4 in the lanes of high nibbles), K4 the load mask of a pair, and
// for Q5_0 Z22 the fifth bits' VPERMB indices and Z23 VPSHUFBITQMB's bit
// indices (clobbers AX).
func vbmiConsts(size, qs, qh int) {
	p("\tVMOVDQU64 ·q80VbmiQs%d(SB), Z20", size)
	p("\tVMOVDQU64 ·q80VbmiShift(SB), Z21")
	p("\tMOVQ $0x%x, AX", uint64(1)<<(2*size)-1)
	p("\tKMOVQ AX, K4")
	if qh >= 0 {
		p("\tVMOVDQU64 ·q80VbmiQh%d(SB), Z22", size)
		p("\tVMOVDQU64 ·q80VbmiBit(SB), Z23")
	}
}

// vbmiTables writes the VBMI path's tables: for each nibble format the
// source byte of every weight byte (lanes 0, 1: block A's 16 nibble bytes,
// 2, 3: block B's; see q80Weights) and, for Q5_0, of qh's bytes (block A's
// four in qwords 0-3, B's in 4-7); the shift counts; the bit indices.
func vbmiTables() {
	for _, f := range []struct{ size, qs, qh int }{{22, 6, 2}, {18, 2, -1}} {
		p("")
		for j := range 64 {
			src := f.qs + j%16
			if j >= 32 {
				src += f.size
			}
			p("DATA ·q80VbmiQs%d+%d(SB)/1, $%d", f.size, j, src)
		}
		p("GLOBL ·q80VbmiQs%d(SB), RODATA|NOPTR, $64", f.size)
		if f.qh < 0 {
			continue
		}
		for j := range 64 {
			src := f.qh + j%8
			if j%8 >= 4 {
				src = 0
			} else if j >= 32 {
				src += f.size
			}
			p("DATA ·q80VbmiQh%d+%d(SB)/1, $%d", f.size, j, src)
		}
		p("GLOBL ·q80VbmiQh%d(SB), RODATA|NOPTR, $64", f.size)
	}
	for w := range 32 {
		c := 0
		if (w/8)%2 == 1 {
			c = 4
		}
		p("DATA ·q80VbmiShift+%d(SB)/2, $%d", 2*w, c)
	}
	p("GLOBL ·q80VbmiShift(SB), RODATA|NOPTR, $64")
	for j := range 64 {
		p("DATA ·q80VbmiBit+%d(SB)/1, $%d", j, j%32)
	}
	p("GLOBL ·q80VbmiBit(SB), RODATA|NOPTR, $64")
}

// q80Weights puts the unsigned weights of the pair of zQ80 blocks (size,
// qs, qh as zQ80's) at o(SI) into Z(r) (clobbers Z(r+1), AX, DX, K3).
func q80Weights(size, qs, qh, o, r int) {
	if size == 34 {
		p("\tVMOVDQU %d(SI), Y%d", o+qs, r)
		p("\tVINSERTI64X4 $1, %d(SI), Z%d, Z%d", o+size+qs, r, r)
		p("\tVPXORD Z14, Z%d, Z%d", r, r)
		return
	}
	if vbmi {
		p("\tVMOVDQU8.Z %d(SI), K4, Z%d", o, r+1)
		p("\tVPERMB Z%d, Z20, Z%d", r+1, r)
		p("\tVPSRLVW Z21, Z%d, Z%d", r, r)
		p("\tVPANDD Z15, Z%d, Z%d", r, r)
		if qh >= 0 {
			p("\tVPERMB Z%d, Z22, Z%d", r+1, r+1)
			p("\tVPSHUFBITQMB Z23, Z%d, K3", r+1)
			p("\tVPADDB Z14, Z%d, K3, Z%d", r, r)
		}
		return
	}
	// Nibbles: lanes 0,1 from block A's 16 bytes, 2,3 from B's; the low
	// nibbles in lanes 0 and 2, the high in 1 and 3.
	p("\tVBROADCASTI32X4 %d(SI), Z%d", o+qs, r)
	p("\tVINSERTI32X4 $2, %d(SI), Z%d, Z%d", o+size+qs, r, r)
	p("\tVINSERTI32X4 $3, %d(SI), Z%d, Z%d", o+size+qs, r, r)
	p("\tVPSRLW $4, Z%d, Z%d", r, r+1)
	p("\tVPBLENDMQ Z%d, Z%d, K2, Z%d", r+1, r, r)
	p("\tVPANDD Z15, Z%d, Z%d", r, r)
	if qh >= 0 {
		p("\tMOVL %d(SI), AX", o+qh)
		p("\tMOVL %d(SI), DX", o+size+qh)
		p("\tSHLQ $32, DX")
		p("\tORQ DX, AX")
		p("\tKMOVQ AX, K3")
		// 0x10 into the bytes whose fifth bit is set (a masked add: the
		// nibbles are below 0x10).
		p("\tVPADDB Z14, Z%d, K3, Z%d", r, r)
	}
}

// zQ80: a Q8_0, Q5_0 or Q4_0 row (blocks of size bytes: an fp16 scale, for
// Q5_0 the 32 fifth bits at qh, the values or nibbles at qs) dotted with
// activations quantized to Q8_0, in integers as llama.cpp's
// ggml_vec_dot_q{8,5,4}_0_q8_0 do, with AVX-512 VNNI: two blocks per
// vector (block A in bytes 0-31, B in 32-63), four per iteration. The
// weights enter VPDPBUSD unsigned, offset by off (128 for Q8_0, whose
// bytes are flipped by XOR 0x80; 16 and 8 are the formats' own offsets);
// lanes 0-7 hold block A's Σ u·q, 8-15 B's, converted to float and
// multiplied by the products of the two blocks' scales (spread by
// VPERMPS) into Z0/Z1. The offsets come off at the end through the
// activations' per-block d·Σq (ds): X2 accumulates Σ dw·ds, and the result
// is Z0+Z1 − off·X2. Z15 = 0x0f bytes, Z14 = 0x10 bytes (Q5_0) or 0x80
// (Q8_0), Z16/Z17 = the spreading indices, K2 = the high-nibble quadwords.
func zQ80(name string, size, qs, qh int, off uint32, many bool) {
	p("")
	if many {
		p("// func %s(ws *[]byte, q *int8, d, ds *float32, n, rows int, out *float32): rows > 0, n blocks each, n even.", name)
		p("TEXT ·%s(SB), NOSPLIT, $24-56", name)
		aheadStart()
	} else {
		p("// func %s(w *byte, q *int8, d, ds *float32, n int) float32: n blocks, n even.", name)
		p("TEXT ·%s(SB), NOSPLIT, $0-44", name)
	}
	p("\tVMOVDQU32 ·q80Idx(SB), Z16")
	p("\tVMOVDQU32 ·q80Idx+64(SB), Z17")
	switch {
	case size == 34:
		zConst(14, 0x80808080)
	default:
		zConst(15, 0x0f0f0f0f)
		zConst(14, 0x10101010)
		p("\tMOVL $0xcc, AX")
		p("\tKMOVW AX, K2")
		if vbmi {
			vbmiConsts(size, qs, qh)
		}
	}
	intArgs(name, many, "ds", "R8")
	p("\tVPXORD Z0, Z0, Z0")
	p("\tVPXORD Z1, Z1, Z1")
	p("\tVPXORD Z2, Z2, Z2")
	// pair dots the pair of blocks at o(SI) with the activations at
	// xoff(DI) and adds it, scaled by Z(sc), into Z(acc).
	pair := func(o, xoff, sc, acc, r int) {
		q80Weights(size, qs, qh, o, r)
		p("\tVPXORD Z%d, Z%d, Z%d", r+2, r+2, r+2)
		p("\tVPDPBUSD %d(DI), Z%d, Z%d", xoff, r, r+2)
		p("\tVCVTDQ2PS Z%d, Z%d", r+2, r+2)
		p("\tVFMADD231PS Z%d, Z%d, Z%d", sc, r+2, acc)
	}
	// Four blocks per iteration: their scales converted at once.
	p("%s_quad:", name)
	p("\tCMPQ CX, $4")
	p("\tJLT %s_pair", name)
	if many {
		ahead(4 * size)
	}
	p("\tMOVWLZX 0(SI), AX")
	for i := 1; i < 4; i++ {
		p("\tMOVWLZX %d(SI), DX", i*size)
		p("\tSHLQ $%d, DX", 16*i)
		p("\tORQ DX, AX")
	}
	p("\tVMOVQ AX, X11")
	p("\tVCVTPH2PS X11, X11")
	p("\tVFMADD231PS (R8), X11, X2")
	p("\tVMULPS (BX), X11, X11")
	p("\tVPERMPS Z11, Z17, Z12")
	p("\tVPERMPS Z11, Z16, Z11")
	pair(0, 0, 11, 0, 4)
	pair(2*size, 64, 12, 1, 7)
	p("\tADDQ $%d, SI", 4*size)
	p("\tADDQ $128, DI")
	p("\tADDQ $16, BX")
	p("\tADDQ $16, R8")
	p("\tSUBQ $4, CX")
	p("\tJMP %s_quad", name)
	p("%s_pair:", name)
	p("\tTESTQ CX, CX")
	p("\tJZ %s_done", name)
	p("\tMOVWLZX 0(SI), AX")
	p("\tMOVWLZX %d(SI), DX", size)
	p("\tSHLL $16, DX")
	p("\tORL DX, AX")
	p("\tVMOVD AX, X11")
	p("\tVCVTPH2PS X11, X11")
	p("\tVMOVQ (R8), X12")
	p("\tVFMADD231PS X12, X11, X2")
	p("\tVMOVQ (BX), X12")
	p("\tVMULPS X12, X11, X11")
	p("\tVPERMPS Z11, Z16, Z11")
	pair(0, 0, 11, 0, 4)
	p("%s_done:", name)
	p("\tVADDPS Z1, Z0, Z0")
	p("\tVEXTRACTF64X4 $1, Z0, Y1")
	p("\tVADDPS Y1, Y0, Y0")
	// Y0 − off·X2.
	p("\tMOVL $0x%08x, AX", math.Float32bits(float32(off)))
	p("\tVMOVD AX, X3")
	p("\tVBROADCASTSS X3, X3")
	p("\tVMULPS X3, X2, X2")
	p("\tVSUBPS Y2, Y0, Y0")
	if many {
		hsumNext(name)
		return
	}
	hsumRet(40)
}

// yQ80: DotQ80Many's kernels at the AVX2 level (no AVX-512), as llama.cpp's
// AVX2 ggml_vec_dot_q8_0_q8_0 / q5_0 / q4_0 compute a block, for R
// activation rows at once (R = 1: the Many kernel; R > 1: DotQ80RowsMany's,
// the rows interleaved as Q80Rows holds them: per quad of blocks R × 128
// bytes and R × 4 scales, then a last pair as R × 64 and R × 2).
//
// Without vnni (…AVX2): each block's 32 weights are made signed bytes once
// (Q8_0 as stored; Q4_0's nibbles − 8; Q5_0's nibbles with 0xf0 OR-ed in
// where the fifth bit is clear — the fifth bits spread to bytes as
// llama.cpp's bytes_from_bits_32 does: qh broadcast, VPSHUFB picking byte
// i/8 for byte i, OR with every bit but bit i%8 set, compared with all
// ones), then for each row |w| against x·sign(w) (VPSIGNB: no pair sum can
// saturate, 2·128·127 < 2¹⁵) by VPMADDUBSW, VPMADDWD by ones into int32
// lanes; the activations' ds is not needed (no offsets).
//
// With VPDPBUSD (…AVXVNNI, for the CPUs with AVX-VNNI but no AVX-512): the
// weights are made unsigned once, offset by off as the AVX-512 kernels
// (zQ80) take them (Q8_0 XOR 0x80, Q4_0's nibbles as stored, Q5_0's with
// 0x10 OR-ed in where the fifth bit is set), and each row's 32 activations
// meet them in one VPDPBUSD straight from memory (VEX-encoded by
// vpdpbusdDI: Go's assembler writes only the EVEX form); the offset comes
// off per pair of blocks as −off·dw·ds into one of the row's accumulators.
// The …EVEXVNNI twins are the same code with VPDPBUSD in its AVX-512 VL
// encoding, as Go's assembler writes it: they run where AVX-512 VNNI does,
// so that the tests check the AVX-VNNI kernels' arithmetic on CPUs without
// AVX-VNNI (TestAVXVNNIEncoding checks that each …AVXVNNI kernel is its
// twin with only that instruction's encoding changed).
//
// Either way the int32 lanes are converted and scaled by the two blocks'
// scales into the row's accumulators Y8+2r (even blocks) and Y9+2r (odd):
// every row gets the same operations whatever R, so the results are the
// bits of the one-row kernel of the same form. Constants are read from
// memory (yConsts) to leave the registers to the accumulators.
func yQ80(name string, size, qs, qh, R int, form vnniForm, off float32) {
	vnni := form != plain
	suffix := [...]string{plain: "AVX2", vex: "AVXVNNI", evex: "EVEXVNNI"}[form]
	if R > 1 {
		name = fmt.Sprintf("%sRows%dMany%s", name, R, suffix)
	} else {
		name += "Many" + suffix
	}
	p("")
	p("// func %s(ws *[]byte, q *int8, d, ds *float32, n, rows int, out *float32): rows > 0, n blocks each, n even, %d activation rows interleaved per quad of blocks.", name, R)
	p("TEXT ·%s(SB), NOSPLIT, $24-56", name)
	rowsArgs(name, true, "ds", "R8")
	for r := range 2 * R {
		p("\tVXORPS Y%d, Y%d, Y%d", 8+r, 8+r, 8+r)
	}
	// unpack makes the 32 weights of the block at o(SI) signed bytes in
	// Y(dst), or with vnni unsigned bytes offset by off (clobbers Y2, Y3).
	unpack := func(o, dst int) {
		if size == 34 {
			p("\tVMOVDQU %d(SI), Y%d", o+qs, dst)
			if vnni {
				p("\tVPXOR ·yConsts+192(SB), Y%d, Y%d", dst, dst)
			}
			return
		}
		p("\tVMOVDQU %d(SI), X%d", o+qs, dst)
		p("\tVPSRLW $4, X%d, X2", dst)
		p("\tVINSERTI128 $1, X2, Y%d, Y%d", dst, dst)
		p("\tVPAND ·yConsts+32(SB), Y%d, Y%d", dst, dst)
		if qh < 0 {
			if !vnni {
				p("\tVPSUBB ·yConsts+64(SB), Y%d, Y%d", dst, dst)
			}
			return
		}
		p("\tVPBROADCASTD %d(SI), Y2", o+qh)
		p("\tVPSHUFB ·yConsts+160(SB), Y2, Y2")
		p("\tVPOR ·yConsts+96(SB), Y2, Y2")
		p("\tVPCMPEQB Y3, Y3, Y3")
		p("\tVPCMPEQB Y3, Y2, Y2")
		if vnni {
			p("\tVPAND ·yConsts+224(SB), Y2, Y2")
		} else {
			p("\tVPANDN ·yConsts+128(SB), Y2, Y2")
		}
		p("\tVPOR Y2, Y%d, Y%d", dst, dst)
	}
	// pair: blocks 2p and 2p+1 of a unit whose rows lie xs bytes (q) and
	// ds bytes (d, ds) apart.
	pair := func(pi, xs, dsz int) {
		o := 2 * pi * size
		p("\tMOVWLZX %d(SI), AX", o)
		p("\tMOVWLZX %d(SI), DX", o+size)
		p("\tSHLL $16, DX")
		p("\tORL DX, AX")
		p("\tVMOVD AX, X6")
		p("\tVCVTPH2PS X6, X6")
		unpack(o, 0)
		unpack(o+size, 1)
		for r := range R {
			p("\tVMOVQ %d(BX), X7", r*dsz+8*pi)
			p("\tVMULPS X6, X7, X7")
			p("\tVBROADCASTSS X7, Y4")
			p("\tVMOVSHDUP X7, X5")
			p("\tVBROADCASTSS X5, Y5")
			if vnni {
				// −off·dw·ds of both blocks into lanes 0 and 1 (VMOVQ
				// clears the others) of the even accumulator in a quad's
				// first pair, the odd one in its second: each chain then
				// waits for three multiply-adds a quad, not four and two.
				p("\tVMOVQ %d(R8), X7", r*dsz+8*pi)
				p("\tVMULPS X6, X7, X7")
				p("\tVFMADD231PS ·yConsts+%d(SB), Y7, Y%d", yOffConst(off), 8+2*r+pi)
			}
			for b := range 2 {
				res := 3 // the block's int32 lanes
				if vnni {
					res = 2 + b
					p("\tVPXOR Y%d, Y%d, Y%d", res, res, res)
					if form == vex {
						vpdpbusdDI(r*xs+64*pi+32*b, b, res)
					} else {
						p("\tVPDPBUSD %d(DI), Y%d, Y%d", r*xs+64*pi+32*b, b, res)
					}
				} else {
					p("\tVMOVDQU %d(DI), Y2", r*xs+64*pi+32*b)
					p("\tVPSIGNB Y%d, Y2, Y2", b)
					p("\tVPSIGNB Y%d, Y%d, Y3", b, b)
					p("\tVPMADDUBSW Y2, Y3, Y3")
					p("\tVPMADDWD ·yConsts+0(SB), Y3, Y3")
				}
				p("\tVCVTDQ2PS Y%d, Y%d", res, res)
				p("\tVFMADD231PS Y%d, Y%d, Y%d", 4+b, res, 8+2*r+b)
			}
		}
	}
	p("%s_quad:", name)
	p("\tCMPQ CX, $4")
	p("\tJLT %s_pair", name)
	pair(0, 128, 16)
	pair(1, 128, 16)
	p("\tADDQ $%d, SI", 4*size)
	p("\tADDQ $%d, DI", 128*R)
	p("\tADDQ $%d, BX", 16*R)
	if vnni {
		p("\tADDQ $%d, R8", 16*R)
	}
	p("\tSUBQ $4, CX")
	p("\tJMP %s_quad", name)
	p("%s_pair:", name)
	p("\tTESTQ CX, CX")
	p("\tJZ %s_done", name)
	pair(0, 64, 8)
	p("%s_done:", name)
	for r := range R {
		p("\tVADDPS Y%d, Y%d, Y%d", 9+2*r, 8+2*r, 8+2*r)
	}
	yRowsOut(name, R, func(r int) int { return 8 + 2*r })
}

// vnniForm is how a yQ80 kernel multiplies: VPMADDUBSW + VPMADDWD
// (plain), or VPDPBUSD in its VEX (AVX-VNNI) or EVEX (AVX-512 VL)
// encoding.
type vnniForm int

const (
	plain vnniForm = iota
	vex
	evex
)

// vpdpbusdDI writes VPDPBUSD disp(DI), Y(u), Y(dst) in its VEX encoding
// (AVX-VNNI: VEX.256.66.0F38.W0 50 /r, DI as the base with a 32-bit
// displacement): each int32 lane of Y(dst) gains the four products of
// Y(u)'s unsigned bytes with the signed bytes in memory. Go's assembler
// writes VPDPBUSD only in its AVX-512 (EVEX) form, which a CPU with
// AVX-VNNI but no AVX-512 does not run.
func vpdpbusdDI(disp, u, dst int) {
	rxb := 0x62 // X̄ and B̄ set (no index, DI), map 0F38
	if dst < 8 {
		rxb |= 0x80 // R̄
	}
	vvvv := (^u & 15) << 3
	modrm := 0x80 | (dst&7)<<3 | 7 // [DI + disp32]
	p("\tBYTE $0xc4; BYTE $0x%02x; BYTE $0x%02x; BYTE $0x50; BYTE $0x%02x; LONG $0x%08x // VPDPBUSD %d(DI), Y%d, Y%d",
		rxb, vvvv|0x05, modrm, uint32(int32(disp)), disp, u, dst)
}

// yOffConst is the offset of −off (eight float32 lanes) in yConsts.
func yOffConst(off float32) int {
	switch off {
	case 128:
		return 256
	case 16:
		return 288
	case 8:
		return 320
	}
	panic(fmt.Sprintf("gen: no constant for offset %g", off))
}

// yConsts: the AVX2 integer kernels' constants, 32 bytes each: int16 ones
// (+0), 0x0f bytes (+32), 0x08 bytes (+64), the bit mask of
// bytes_from_bits_32 (+96: every bit of byte i but bit i%8), 0xf0 bytes
// (+128), and the VPSHUFB indices taking byte i/8 of a broadcast dword into
// byte i (+160; in each 128-bit lane bytes 0, 1 low and 2, 3 high), 0x80
// bytes (+192: yGemm's Q8_0 weights made signed again, the AVX-VNNI kernels'
// Q8_0 weights made unsigned), 0x10 bytes (+224: Q5_0's fifth bits, AVX-VNNI) and
// −128, −16 and −8 as float32 lanes (+256, +288, +320: yOffConst).
func yConsts() {
	p("")
	p("// yConsts: the AVX2 integer kernels' constants (yQ80).")
	for i, v := range []uint64{0x0001000100010001, 0x0f0f0f0f0f0f0f0f, 0x0808080808080808, 0x7fbfdfeff7fbfdfe, 0xf0f0f0f0f0f0f0f0} {
		for j := range 4 {
			p("DATA ·yConsts+%d(SB)/8, $0x%016x", 32*i+8*j, v)
		}
	}
	for j := range 4 {
		p("DATA ·yConsts+%d(SB)/8, $0x%016x", 160+8*j, uint64(0x0101010101010101)*uint64(j))
	}
	for j := range 4 {
		p("DATA ·yConsts+%d(SB)/8, $0x%016x", 192+8*j, uint64(0x8080808080808080))
	}
	for j := range 4 {
		p("DATA ·yConsts+%d(SB)/8, $0x%016x", 224+8*j, uint64(0x1010101010101010))
	}
	for i, off := range []float32{128, 16, 8} {
		bits := uint64(math.Float32bits(-off))
		for j := range 4 {
			p("DATA ·yConsts+%d(SB)/8, $0x%016x", 256+32*i+8*j, bits<<32|bits)
		}
	}
	p("GLOBL ·yConsts(SB), RODATA|NOPTR, $352")
}

// yQ4KQ8K: DotQ8KMany's Q4_K kernel at the AVX2 level (no VNNI), as
// llama.cpp's AVX2 ggml_vec_dot_q4_K_q8_K, for R activation rows at once
// (R = 1: the Many kernel; R > 1: DotQ8KRowsMany's, the rows interleaved
// per block as Q8KRows holds them: qn R × 256 bytes, d R floats, sums R ×
// 8 int32). Per 256-element block the scales and mins are unpacked once
// (kScalesInt; the scales parked as int32 at 32(SP) for VPBROADCASTW), the
// mins times each row's sums per 32 (VPMULLD) scaled by dmin·dx come off
// the row's accumulator (Y12+r), then each 32 nibbles against the row's 32
// activations (natural order) by VPMADDUBSW, the int16 pairs times their
// scale summed into int32 lanes by VPMADDWD (Y0, Y1, Y2, Y10 by row),
// converted once per block and scaled by d·dx into the accumulator: every
// row gets the same operations whatever R, so the results are the bits of
// the one-row kernel. Y11 = 0x0f bytes, Y5 = d.
func yQ4KQ8K(R int) {
	name := "dotQ4KQ8KManyAVX2"
	if R > 1 {
		name = fmt.Sprintf("dotQ4KQ8KRows%dManyAVX2", R)
	}
	sumi := [4]int{0, 1, 2, 10}
	p("")
	p("// func %s(ws *[]byte, q *int8, d *float32, sums *int32, n, rows int, out *float32): rows > 0, n Q4_K blocks each, %d activation rows interleaved per block, q in natural order.", name, R)
	p("TEXT ·%s(SB), NOSPLIT, $64-56", name)
	bcastConst(11, 0x0f0f0f0f)
	rowsArgs(name, true, "sums", "DX")
	for r := range R {
		p("\tVXORPS Y%d, Y%d, Y%d", 12+r, 12+r, 12+r)
	}
	p("\tTESTQ CX, CX")
	p("\tJZ %s_done", name)
	p("%s_block:", name)
	kScalesInt()
	p("\tVMOVDQU Y3, 32(SP)")
	p("\tMOVL 0(SI), AX")
	p("\tVMOVD AX, X5")
	p("\tVCVTPH2PS X5, X5")
	p("\tVMOVSHDUP X5, X6")
	p("\tVBROADCASTSS X6, Y6")
	p("\tVBROADCASTSS X5, Y5")
	for r := range R {
		p("\tVPMULLD %d(DX), Y4, Y8", 32*r)
		p("\tVCVTDQ2PS Y8, Y8")
		p("\tVBROADCASTSS %d(BX), Y9", 4*r)
		p("\tVMULPS Y6, Y9, Y9")
		p("\tVFNMADD231PS Y9, Y8, Y%d", 12+r)
		p("\tVPXOR Y%d, Y%d, Y%d", sumi[r], sumi[r], sumi[r])
	}
	for c := range 4 {
		p("\tVMOVDQU %d(SI), Y3", 16+32*c)
		p("\tVPSRLW $4, Y3, Y4")
		p("\tVPAND Y11, Y3, Y3")
		p("\tVPAND Y11, Y4, Y4")
		p("\tVPBROADCASTW %d(SP), Y6", 32+8*c)
		p("\tVPBROADCASTW %d(SP), Y7", 32+8*c+4)
		for r := range R {
			p("\tVPMADDUBSW %d(DI), Y3, Y8", 256*r+64*c)
			p("\tVPMADDWD Y6, Y8, Y8")
			p("\tVPMADDUBSW %d(DI), Y4, Y9", 256*r+64*c+32)
			p("\tVPMADDWD Y7, Y9, Y9")
			p("\tVPADDD Y8, Y%d, Y%d", sumi[r], sumi[r])
			p("\tVPADDD Y9, Y%d, Y%d", sumi[r], sumi[r])
		}
	}
	for r := range R {
		p("\tVCVTDQ2PS Y%d, Y%d", sumi[r], sumi[r])
		p("\tVBROADCASTSS %d(BX), Y9", 4*r)
		p("\tVMULPS Y5, Y9, Y9")
		p("\tVFMADD231PS Y9, Y%d, Y%d", sumi[r], 12+r)
	}
	p("\tADDQ $144, SI")
	p("\tADDQ $%d, DI", 256*R)
	p("\tADDQ $%d, BX", 4*R)
	p("\tADDQ $%d, DX", 32*R)
	p("\tDECQ CX")
	p("\tJNZ %s_block", name)
	p("%s_done:", name)
	yRowsOut(name, R, func(r int) int { return 12 + r })
}

// yRowsOut reduces each row's accumulator Y(acc(r)) to its lane sum,
// stores it at 4r(R14) and loops to the next weight row (a Many kernel's
// frame; clobbers X7).
func yRowsOut(name string, R int, acc func(r int) int) {
	for r := range R {
		p("\tVEXTRACTF128 $1, Y%d, X7", acc(r))
		p("\tVADDPS X7, X%d, X7", acc(r))
		p("\tVHADDPS X7, X7, X7")
		p("\tVHADDPS X7, X7, X7")
		p("\tVMOVSS X7, %d(R14)", 4*r)
	}
	rowsNext(name, true, R)
}

// yQ6KQ8K: DotQ8KMany's Q6_K kernel at the AVX2 level, as llama.cpp's
// AVX2 ggml_vec_dot_q6_K_q8_K, for R activation rows at once (laid out as
// in yQ4KQ8K; sums16 R × 16 int32): each row's int32 lanes (Y0+r) start
// at −32·Σ sc·sums16 (VPMULLD); each 32 six-bit values (0..63, the offset
// 32 taken by that start) are assembled once from ql's nibbles and qh's
// bit pairs (loaded from the block as needed) with word shifts and byte
// masks, and meet each row's 32 activations by VPMADDUBSW; the two
// 16-element sub-blocks' scales (int16 at 32(SP)) are applied by VPMADDWD;
// once per block the lanes are converted and scaled by d·dx into the row's
// accumulator (Y12+r). Y9 = 0x0f, Y10 = 0x03, Y11 = 0x30 bytes.
func yQ6KQ8K(R int) {
	name := "dotQ6KQ8KManyAVX2"
	if R > 1 {
		name = fmt.Sprintf("dotQ6KQ8KRows%dManyAVX2", R)
	}
	p("")
	p("// func %s(ws *[]byte, q *int8, d *float32, sums16 *int32, n, rows int, out *float32): rows > 0, n Q6_K blocks each, %d activation rows interleaved per block, q in natural order.", name, R)
	p("TEXT ·%s(SB), NOSPLIT, $64-56", name)
	bcastConst(9, 0x0f0f0f0f)
	bcastConst(10, 0x03030303)
	bcastConst(11, 0x30303030)
	rowsArgs(name, true, "sums16", "DX")
	for r := range R {
		p("\tVXORPS Y%d, Y%d, Y%d", 12+r, 12+r, 12+r)
	}
	p("\tTESTQ CX, CX")
	p("\tJZ %s_done", name)
	p("%s_block:", name)
	p("\tVPMOVSXBW 192(SI), Y6")
	p("\tVMOVDQU Y6, 32(SP)")
	p("\tVPMOVSXBD 192(SI), Y4")
	p("\tVPMOVSXBD 200(SI), Y5")
	for r := range R {
		p("\tVPMULLD %d(DX), Y4, Y6", 64*r)
		p("\tVPMULLD %d(DX), Y5, Y7", 64*r+32)
		p("\tVPADDD Y7, Y6, Y6")
		p("\tVPSLLD $5, Y6, Y6")
		p("\tVPXOR Y%d, Y%d, Y%d", r, r, r)
		p("\tVPSUBD Y6, Y%d, Y%d", r, r)
	}
	for n := range 2 {
		ql0, ql1, qh := 64*n, 64*n+32, 128+32*n
		for c := range 4 {
			switch c {
			case 0: // ql0 & 0x0f | (qh & 3) << 4
				p("\tVPAND %d(SI), Y9, Y4", ql0)
				p("\tVPAND %d(SI), Y10, Y5", qh)
				p("\tVPSLLW $4, Y5, Y5")
			case 1: // ql1 & 0x0f | (qh << 2) & 0x30
				p("\tVPAND %d(SI), Y9, Y4", ql1)
				p("\tVMOVDQU %d(SI), Y5", qh)
				p("\tVPSLLW $2, Y5, Y5")
				p("\tVPAND Y11, Y5, Y5")
			case 2: // ql0 >> 4 | qh & 0x30
				p("\tVMOVDQU %d(SI), Y4", ql0)
				p("\tVPSRLW $4, Y4, Y4")
				p("\tVPAND Y9, Y4, Y4")
				p("\tVPAND %d(SI), Y11, Y5", qh)
			case 3: // ql1 >> 4 | (qh >> 2) & 0x30
				p("\tVMOVDQU %d(SI), Y4", ql1)
				p("\tVPSRLW $4, Y4, Y4")
				p("\tVPAND Y9, Y4, Y4")
				p("\tVMOVDQU %d(SI), Y5", qh)
				p("\tVPSRLW $2, Y5, Y5")
				p("\tVPAND Y11, Y5, Y5")
			}
			p("\tVPOR Y5, Y4, Y4")
			g := 4*n + c
			p("\tVPBROADCASTW %d(SP), Y6", 32+4*g)
			p("\tVPBROADCASTW %d(SP), X7", 32+4*g+2)
			p("\tVINSERTI128 $1, X7, Y6, Y6")
			for r := range R {
				p("\tVPMADDUBSW %d(DI), Y4, Y7", 256*r+128*n+32*c)
				p("\tVPMADDWD Y6, Y7, Y7")
				p("\tVPADDD Y7, Y%d, Y%d", r, r)
			}
		}
	}
	p("\tMOVWLZX 208(SI), AX")
	p("\tVMOVD AX, X8")
	p("\tVCVTPH2PS X8, X8")
	p("\tVBROADCASTSS X8, Y8")
	for r := range R {
		p("\tVCVTDQ2PS Y%d, Y%d", r, r)
		p("\tVBROADCASTSS %d(BX), Y7", 4*r)
		p("\tVMULPS Y8, Y7, Y7")
		p("\tVFMADD231PS Y7, Y%d, Y%d", r, 12+r)
	}
	p("\tADDQ $210, SI")
	p("\tADDQ $%d, DI", 256*R)
	p("\tADDQ $%d, BX", 4*R)
	p("\tADDQ $%d, DX", 64*R)
	p("\tDECQ CX")
	p("\tJNZ %s_block", name)
	p("%s_done:", name)
	yRowsOut(name, R, func(r int) int { return 12 + r })
}

// q80Idx: VPERMPS indices spreading floats 0, 1 (and 2, 3 at +64) over
// lanes 0-7 and 8-15.
func q80Idx() {
	p("")
	p("// q80Idx: the VPERMPS indices that spread two scales over lanes 0-7 and")
	p("// 8-15 (the zQ80 kernels).")
	for l := range 32 {
		p("DATA ·q80Idx+%d(SB)/4, $%d", 4*l, l/8)
	}
	p("GLOBL ·q80Idx(SB), RODATA|NOPTR, $128")
}

// rowsArgs opens a Rows kernel (w or ws, q, d, a fourth pointer named arg
// into reg, n, [rows,] out) after its constants are set: in the Many form
// the row loop of manyStart, with out in R14 either way.
func rowsArgs(name string, many bool, arg, reg string) {
	intArgs(name, many, arg, reg)
	if many {
		p("\tMOVQ 16(SP), R14")
	} else {
		p("\tMOVQ out+40(FP), R14")
	}
}

// rowsHeader writes a Rows kernel's TEXT line (the Many form takes rows
// and keeps manyStart's 24-byte frame).
func rowsHeader(name string, many bool, doc string) {
	p("")
	if many {
		p("// func %s(ws *[]byte, q *int8, d *float32, x4 *, n, rows int, out *float32): %s; out[i*R+r] is weight row i with activation row r.", name, doc)
		p("TEXT ·%s(SB), NOSPLIT, $24-56", name)
		return
	}
	p("// func %s(w *byte, q *int8, d *float32, x4 *, n int, out *float32): %s.", name, doc)
	p("TEXT ·%s(SB), NOSPLIT, $0-48", name)
}

// rowsNext ends a Rows kernel: in the Many form, on to the next weight
// row (R results further on).
func rowsNext(name string, many bool, R int) {
	if many {
		p("\tADDQ $%d, 16(SP)", 4*R)
		p("\tADDQ $24, 0(SP)")
		p("\tDECQ 8(SP)")
		p("\tJNZ %s_row", name)
	}
	p("\tVZEROUPPER")
	p("\tRET")
}

// zRowOut reduces the 16 float lanes of Z(acc), less the 8 of Y(min) when
// min ≥ 0, and stores the sum at off(R14) (clobbers Y5, X7).
func zRowOut(acc, min, off int) {
	p("\tVEXTRACTF64X4 $1, Z%d, Y5", acc)
	p("\tVADDPS Y5, Y%d, Y5", acc)
	if min >= 0 {
		p("\tVSUBPS Y%d, Y5, Y5", min)
	}
	p("\tVEXTRACTF128 $1, Y5, X7")
	p("\tVADDPS X7, X5, X5")
	p("\tVHADDPS X5, X5, X5")
	p("\tVHADDPS X5, X5, X5")
	p("\tVMOVSS X5, %d(R14)", off)
}

// zQ4KQ8KRows: dotQ4KQ8KVNNI for R activation rows at once (a decode
// batch): each block's nibbles, scales and mins are unpacked once and
// dotted with the R rows, which the caller interleaves per block (q: R ×
// 256 bytes per block in the Q4_K kernel order, d: R floats, sums: R × 8
// int32). Row r's sum goes to out[r]. Accumulators: Z28+r (d·dx·Σ sc·Σq·qx)
// and Y0, Y1, Y2, Y10 (dmin·dx·m·sums).
func zQ4KQ8KRows(R int, many bool) {
	name := fmt.Sprintf("dotQ4KQ8KRows%dVNNI", R)
	if many {
		name = fmt.Sprintf("dotQ4KQ8KRows%dManyVNNI", R)
	}
	minAcc := []int{0, 1, 2, 10}
	rowsHeader(name, many, fmt.Sprintf("n Q4_K blocks, %d rows, x4 = sums *int32", R))
	zConst(6, 0x0f0f0f0f)
	for i := range 4 {
		p("\tVMOVDQU32 ·q4kq8kIdx+%d(SB), Z%d", 64*i, 16+i)
	}
	rowsArgs(name, many, "sums", "DX")
	for r := range R {
		p("\tVPXORD Z%d, Z%d, Z%d", 28+r, 28+r, 28+r)
		p("\tVPXORD Z%d, Z%d, Z%d", minAcc[r], minAcc[r], minAcc[r])
	}
	p("\tTESTQ CX, CX")
	p("\tJZ %s_done", name)
	p("%s_block:", name)
	kScalesInt()
	for i := range 4 {
		p("\tVPERMD Z3, Z%d, Z%d", 16+i, 11+i)
	}
	// The nibbles of both halves: lo0, hi0, lo1, hi1.
	nib := []int{8, 9, 26, 27}
	for h := range 2 {
		p("\tVMOVDQU64 %d(SI), Z7", 16+64*h)
		p("\tVPANDD Z6, Z7, Z%d", nib[2*h])
		p("\tVPSRLD $4, Z7, Z%d", nib[2*h+1])
		p("\tVPANDD Z6, Z%d, Z%d", nib[2*h+1], nib[2*h+1])
	}
	p("\tMOVL 0(SI), AX")
	p("\tVMOVD AX, X5")
	p("\tVCVTPH2PS X5, X5")
	for r := range R {
		// d·dx, dmin·dx of row r ([d, dmin] stays in X5).
		p("\tVBROADCASTSS %d(BX), X7", 4*r)
		p("\tVMULPS X7, X5, X7")
		p("\tVBROADCASTSS X7, Z20")
		p("\tVMOVSHDUP X7, X7")
		p("\tVBROADCASTSS X7, Y21")
		p("\tVPMULLD %d(DX), Y4, Y15", 32*r)
		p("\tVCVTDQ2PS Y15, Y15")
		p("\tVFMADD231PS Y21, Y15, Y%d", minAcc[r])
		for i := range 4 {
			p("\tVPXORD Z%d, Z%d, Z%d", 22+i, 22+i, 22+i)
		}
		// Partials in the order of zQ4KQ8K: lo0 (22), hi0 (23), lo1 (24), hi1 (25).
		for i := range 4 {
			p("\tVPDPBUSD %d(DI), Z%d, Z%d", 256*r+64*i, nib[i], 22+i)
		}
		for i := range 4 {
			p("\tVPMULLD Z%d, Z%d, Z%d", 11+i, 22+i, 22+i)
		}
		p("\tVPADDD Z23, Z22, Z22")
		p("\tVPADDD Z25, Z24, Z24")
		p("\tVPADDD Z24, Z22, Z22")
		p("\tVCVTDQ2PS Z22, Z22")
		p("\tVFMADD231PS Z20, Z22, Z%d", 28+r)
	}
	p("\tADDQ $144, SI")
	p("\tADDQ $%d, DI", 256*R)
	p("\tADDQ $%d, BX", 4*R)
	p("\tADDQ $%d, DX", 32*R)
	p("\tDECQ CX")
	p("\tJNZ %s_block", name)
	p("%s_done:", name)
	for r := range R {
		zRowOut(28+r, minAcc[r], 4*r)
	}
	rowsNext(name, many, R)
}

// zQ6KQ8KRows: dotQ6KQ8KVNNI for R interleaved activation rows (q: R ×
// 256 bytes per block in natural order, d: R floats, sums16: R × 16
// int32), each block's 6-bit values and scales unpacked once. Row r's sum
// goes to out[r]; accumulators Z0, Z1, Z2, Z4.
func zQ6KQ8KRows(R int, many bool) {
	name := fmt.Sprintf("dotQ6KQ8KRows%dVNNI", R)
	if many {
		name = fmt.Sprintf("dotQ6KQ8KRows%dManyVNNI", R)
	}
	accs := []int{0, 1, 2, 4}
	rowsHeader(name, many, fmt.Sprintf("n Q6_K blocks, %d rows, x4 = sums16 *int32 (per 16)", R))
	zConst(6, 0x0f0f0f0f)
	zConst(17, 0x03030303)
	p("\tVMOVDQU64 ·q6kq8kShift+0(SB), Z16")
	p("\tVMOVDQU64 ·q6kq8kShift+64(SB), Z18")
	for i := range 4 {
		p("\tVMOVDQU32 ·q6kq8kIdx+%d(SB), Z%d", 64*i, 26+i)
	}
	rowsArgs(name, many, "sums", "DX")
	for r := range R {
		p("\tVPXORD Z%d, Z%d, Z%d", accs[r], accs[r], accs[r])
	}
	p("\tTESTQ CX, CX")
	p("\tJZ %s_done", name)
	p("%s_block:", name)
	p("\tVPMOVSXBD 192(SI), Z3")
	// The values: n=0 low/high in Z8/Z9, n=1 in Z30/Z31; the scales per
	// lane in Z13, Z14 (n=0) and Z19, Z21 (n=1).
	vals := [][2]int{{8, 9}, {30, 31}}
	perms := [][2]int{{13, 14}, {19, 21}}
	for n := range 2 {
		lo, hi := vals[n][0], vals[n][1]
		p("\tVMOVDQU64 %d(SI), Z7", 64*n)
		p("\tVBROADCASTI64X4 %d(SI), Z10", 128+32*n)
		p("\tVPANDD Z6, Z7, Z%d", lo)
		p("\tVPSRLVQ Z16, Z10, Z11")
		p("\tVPANDD Z17, Z11, Z11")
		p("\tVPSLLW $4, Z11, Z11")
		p("\tVPORD Z11, Z%d, Z%d", lo, lo)
		p("\tVPSRLW $4, Z7, Z%d", hi)
		p("\tVPANDD Z6, Z%d, Z%d", hi, hi)
		p("\tVPSRLVQ Z18, Z10, Z12")
		p("\tVPANDD Z17, Z12, Z12")
		p("\tVPSLLW $4, Z12, Z12")
		p("\tVPORD Z12, Z%d, Z%d", hi, hi)
		p("\tVPERMD Z3, Z%d, Z%d", 26+2*n, perms[n][0])
		p("\tVPERMD Z3, Z%d, Z%d", 27+2*n, perms[n][1])
	}
	p("\tMOVWLZX 208(SI), AX")
	p("\tVMOVD AX, X5")
	p("\tVCVTPH2PS X5, X5")
	p("\tVMOVAPS X5, X23")
	for r := range R {
		p("\tVPMULLD %d(DX), Z3, Z15", 64*r)
		p("\tVPSLLD $5, Z15, Z15")
		p("\tVMULSS %d(BX), X23, X5", 4*r)
		p("\tVBROADCASTSS X5, Z20")
		p("\tVPXORD Z22, Z22, Z22")
		for n := range 2 {
			p("\tVPXORD Z24, Z24, Z24")
			p("\tVPXORD Z25, Z25, Z25")
			p("\tVPDPBUSD %d(DI), Z%d, Z24", 256*r+128*n, vals[n][0])
			p("\tVPDPBUSD %d(DI), Z%d, Z25", 256*r+128*n+64, vals[n][1])
			p("\tVPMULLD Z%d, Z24, Z24", perms[n][0])
			p("\tVPMULLD Z%d, Z25, Z25", perms[n][1])
			p("\tVPADDD Z24, Z22, Z22")
			p("\tVPADDD Z25, Z22, Z22")
		}
		p("\tVPSUBD Z15, Z22, Z22")
		p("\tVCVTDQ2PS Z22, Z22")
		p("\tVFMADD231PS Z20, Z22, Z%d", accs[r])
	}
	p("\tADDQ $210, SI")
	p("\tADDQ $%d, DI", 256*R)
	p("\tADDQ $%d, BX", 4*R)
	p("\tADDQ $%d, DX", 64*R)
	p("\tDECQ CX")
	p("\tJNZ %s_block", name)
	p("%s_done:", name)
	for r := range R {
		zRowOut(accs[r], -1, 4*r)
	}
	rowsNext(name, many, R)
}

// zQ80Rows: the zQ80 kernels for R activation rows at once (a decode
// batch), each quad of weight blocks unpacked once: the caller interleaves
// the rows per four blocks (q: R × 128 bytes, d and ds: R × 4 floats per
// quad). n is a multiple of 4; row r's sum goes to out[r]. Accumulators
// Z24+r, offsets X28+r.
func zQ80Rows(name string, size, qs, qh int, off uint32, R int, many bool) {
	rowsHeader(name, many, fmt.Sprintf("n blocks, n even, %d rows, x4 = ds *float32", R))
	p("\tVMOVDQU32 ·q80Idx(SB), Z16")
	p("\tVMOVDQU32 ·q80Idx+64(SB), Z17")
	if size == 34 {
		zConst(14, 0x80808080)
	} else {
		zConst(15, 0x0f0f0f0f)
		zConst(14, 0x10101010)
		p("\tMOVL $0xcc, AX")
		p("\tKMOVW AX, K2")
	}
	rowsArgs(name, many, "ds", "R8")
	for r := range R {
		p("\tVPXORD Z%d, Z%d, Z%d", 24+r, 24+r, 24+r)
		p("\tVPXORD Z%d, Z%d, Z%d", 28+r, 28+r, 28+r)
	}

	p("%s_quad:", name)
	p("\tCMPQ CX, $4")
	p("\tJLT %s_pair", name)
	p("\tMOVWLZX 0(SI), AX")
	for i := 1; i < 4; i++ {
		p("\tMOVWLZX %d(SI), DX", i*size)
		p("\tSHLQ $%d, DX", 16*i)
		p("\tORQ DX, AX")
	}
	p("\tVMOVQ AX, X11")
	p("\tVCVTPH2PS X11, X11")
	q80Weights(size, qs, qh, 0, 4)
	q80Weights(size, qs, qh, 2*size, 7)
	for r := range R {
		p("\tVFMADD231PS %d(R8), X11, X%d", 16*r, 28+r)
		p("\tVMULPS %d(BX), X11, X12", 16*r)
		p("\tVPERMPS Z12, Z16, Z18")
		p("\tVPERMPS Z12, Z17, Z19")
		p("\tVPXORD Z20, Z20, Z20")
		p("\tVPXORD Z21, Z21, Z21")
		p("\tVPDPBUSD %d(DI), Z4, Z20", 128*r)
		p("\tVPDPBUSD %d(DI), Z7, Z21", 128*r+64)
		p("\tVCVTDQ2PS Z20, Z20")
		p("\tVCVTDQ2PS Z21, Z21")
		p("\tVFMADD231PS Z18, Z20, Z%d", 24+r)
		p("\tVFMADD231PS Z19, Z21, Z%d", 24+r)
	}
	p("\tADDQ $%d, SI", 4*size)
	p("\tADDQ $%d, DI", 128*R)
	p("\tADDQ $%d, BX", 16*R)
	p("\tADDQ $%d, R8", 16*R)
	p("\tSUBQ $4, CX")
	p("\tJMP %s_quad", name)
	// A last pair of blocks, interleaved as a pair (q: R × 64 bytes, d
	// and ds: R × 2 floats).
	p("%s_pair:", name)
	p("\tTESTQ CX, CX")
	p("\tJZ %s_done", name)
	p("\tMOVWLZX 0(SI), AX")
	p("\tMOVWLZX %d(SI), DX", size)
	p("\tSHLL $16, DX")
	p("\tORL DX, AX")
	p("\tVMOVD AX, X11")
	p("\tVCVTPH2PS X11, X11")
	q80Weights(size, qs, qh, 0, 4)
	for r := range R {
		p("\tVMOVQ %d(R8), X12", 8*r)
		p("\tVFMADD231PS X12, X11, X%d", 28+r)
		p("\tVMOVQ %d(BX), X12", 8*r)
		p("\tVMULPS X12, X11, X12")
		p("\tVPERMPS Z12, Z16, Z18")
		p("\tVPXORD Z20, Z20, Z20")
		p("\tVPDPBUSD %d(DI), Z4, Z20", 64*r)
		p("\tVCVTDQ2PS Z20, Z20")
		p("\tVFMADD231PS Z18, Z20, Z%d", 24+r)
	}
	p("%s_done:", name)
	p("\tMOVL $0x%08x, AX", math.Float32bits(float32(off)))
	p("\tVMOVD AX, X3")
	p("\tVBROADCASTSS X3, X3")
	for r := range R {
		p("\tVMULPS X3, X%d, X6", 28+r)
		zRowOut(24+r, 6, 4*r)
	}
	rowsNext(name, many, R)
}

// zDqHalf: the AVX-512 F16/BF16 dequantizer, n a multiple of 16, 64 per
// iteration.
func zDqHalf(name string, f16 bool) {
	header(name, 0, "y", fmt.Sprintf("func %s(w *byte, y *float32, n int): n a multiple of 16.", name))
	load := func(off, reg int) {
		if f16 {
			p("\tVCVTPH2PS %d(SI), Z%d", off, reg)
		} else {
			p("\tVPMOVZXWD %d(SI), Z%d", off, reg)
			p("\tVPSLLD $16, Z%d, Z%d", reg, reg)
		}
	}
	p("%s_64:", name)
	p("\tCMPQ CX, $64")
	p("\tJLT %s_16", name)
	for i := range 4 {
		load(32*i, i)
	}
	for i := range 4 {
		p("\tVMOVUPS Z%d, %d(DI)", i, 64*i)
	}
	p("\tADDQ $128, SI")
	p("\tADDQ $256, DI")
	p("\tSUBQ $64, CX")
	p("\tJMP %s_64", name)
	p("%s_16:", name)
	p("\tTESTQ CX, CX")
	p("\tJZ %s_done", name)
	load(0, 0)
	p("\tVMOVUPS Z0, (DI)")
	p("\tADDQ $32, SI")
	p("\tADDQ $64, DI")
	p("\tSUBQ $16, CX")
	p("\tJMP %s_16", name)
	p("%s_done:", name)
	p("\tVZEROUPPER")
	p("\tRET")
}

// quantHalf: y's n floats to F16 at w, rounding to nearest even
// (VCVTPS2PH with immediate 0), 8 (ymm, F16C) or 16 (zmm) at a time; n a
// multiple of the width.
func quantHalf(name string, zmm bool) {
	lanes, reg := 8, "Y"
	if zmm {
		lanes, reg = 16, "Z"
	}
	header(name, 0, "y", fmt.Sprintf("func %s(w *byte, y *float32, n int): n a multiple of %d.", name, lanes))
	p("%s_loop:", name)
	p("\tTESTQ CX, CX")
	p("\tJZ %s_done", name)
	p("\tVMOVUPS (DI), %s0", reg)
	p("\tVCVTPS2PH $0, %s0, (SI)", reg)
	p("\tADDQ $%d, SI", 2*lanes)
	p("\tADDQ $%d, DI", 4*lanes)
	p("\tSUBQ $%d, CX", lanes)
	p("\tJMP %s_loop", name)
	p("%s_done:", name)
	p("\tVZEROUPPER")
	p("\tRET")
}

func main() {
	p("// Code generated by gen.go; DO NOT EDIT.")
	p("")
	p("//go:build amd64 && !noasm")
	p("")
	p("#include \"textflag.h\"")
	halfFloat("dotF16AVX2", true)
	halfFloat("dotBF16AVX2", false)
	q8_0()
	q4K(false)
	q4K(true)
	q6K()
	q32("dotQ4_0AVX2", 18, 2, -1, false, 8)
	q32("dotQ4_1AVX2", 20, 4, -1, true, 0)
	q32("dotQ5_0AVX2", 22, 6, 2, false, 16)
	q32("dotQ5_1AVX2", 24, 8, 4, true, 0)
	dqHalf("dequantF16AVX2", true)
	dqHalf("dequantBF16AVX2", false)
	dqQ8_0()
	dq32("dequantQ4_0AVX2", 18, 2, -1, false, 8)
	dq32("dequantQ4_1AVX2", 20, 4, -1, true, 0)
	dq32("dequantQ5_0AVX2", 22, 6, 2, false, 16)
	dq32("dequantQ5_1AVX2", 24, 8, 4, true, 0)
	dqK4(false)
	dqK4(true)
	dqQ6K()
	zDqHalf("dequantF16AVX512", true)
	quantHalf("quantF16AVX2", false)
	quantHalf("quantF16AVX512", true)
	zDqHalf("dequantBF16AVX512", false)
	zHalf("dotF16AVX512", true, false)
	zHalf("dotBF16AVX512", false, false)
	zQ8_0()
	zQ32("dotQ4_0AVX512", 18, 2, -1, false, 8)
	zQ32("dotQ4_1AVX512", 20, 4, -1, true, 0)
	zQ32("dotQ5_0AVX512", 22, 6, 2, false, 16)
	zQ32("dotQ5_1AVX512", 24, 8, 4, true, 0)
	zQ4K(false)
	zQ4K(true)
	zQ6K()
	zQ4KQ8K(false)
	zQ6KQ8K(false)
	zQ80("dotQ8_0Q80VNNI", 34, 2, -1, 128, false)
	zQ80("dotQ5_0Q80VNNI", 22, 6, 2, 16, false)
	zQ80("dotQ4_0Q80VNNI", 18, 2, -1, 8, false)
	q80Idx()
	// The Many forms: a task's weight rows in one call.
	zHalf("dotF16ManyAVX512", true, true)
	zHalf("dotBF16ManyAVX512", false, true)
	for _, f16 := range []bool{true, false} {
		t := "BF16"
		if f16 {
			t = "F16"
		}
		zHalfTile("dot"+t+"Tile4AVX512", f16, 4, 4, false)
		zHalfTile("dot"+t+"Tile4PAVX512", f16, 4, 4, true)
		zHalfTile("dot"+t+"Tile2PAVX512", f16, 2, 8, true)
	}
	zQ4KQ8K(true)
	zQ6KQ8K(true)
	zQ80("dotQ8_0Q80ManyVNNI", 34, 2, -1, 128, true)
	zQ80("dotQ5_0Q80ManyVNNI", 22, 6, 2, 16, true)
	zQ80("dotQ4_0Q80ManyVNNI", 18, 2, -1, 8, true)
	for _, many := range []bool{false, true} {
		form := ""
		if many {
			form = "Many"
		}
		for r := 2; r <= 4; r++ {
			zQ4KQ8KRows(r, many)
			zQ6KQ8KRows(r, many)
			zQ80Rows(fmt.Sprintf("dotQ8_0Q80Rows%d%sVNNI", r, form), 34, 2, -1, 128, r, many)
			zQ80Rows(fmt.Sprintf("dotQ5_0Q80Rows%d%sVNNI", r, form), 22, 6, 2, 16, r, many)
			zQ80Rows(fmt.Sprintf("dotQ4_0Q80Rows%d%sVNNI", r, form), 18, 2, -1, 8, r, many)
		}
	}
	vbmi = true
	zQ80("dotQ5_0Q80ManyVBMI", 22, 6, 2, 16, true)
	zQ80("dotQ4_0Q80ManyVBMI", 18, 2, -1, 8, true)
	vbmi = false
	vbmiTables()
	zQuantQ8K()
	zQuantQ80()
	zGemm("gemmQ4KQ8KVNNI", false)
	zGemm("gemmQ6KQ8KVNNI", true)
	zGemm80("gemmQ8_0VNNI", 7)
	zGemm80("gemmQ5_0VNNI", 4)
	zGemm80("gemmQ4_0VNNI", 3)
	q5shifts()
	for _, form := range []vnniForm{plain, vex, evex} {
		for R := 1; R <= 4; R++ {
			yQ80("dotQ8_0Q80", 34, 2, -1, R, form, 128)
			yQ80("dotQ5_0Q80", 22, 6, 2, R, form, 16)
			yQ80("dotQ4_0Q80", 18, 2, -1, R, form, 8)
		}
	}
	yConsts()
	for R := 1; R <= 4; R++ {
		yQ4KQ8K(R)
		yQ6KQ8K(R)
	}
	yGemm("gemmQ4KQ8KAVX2", 0)
	yGemm("gemmQ6KQ8KAVX2", 1)
	yGemm("gemmQ8_0AVX2", 7)
	yGemm("gemmQ5_0AVX2", 4)
	yGemm("gemmQ4_0AVX2", 3)
	if err := os.WriteFile("dot_amd64.s", out.Bytes(), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// zAbsMaxBits leaves in X(dst) the largest of the absolute-value bit
// patterns of the nv float vectors at off(SI) (Z31 = 0x7fffffff, clobbers
// Z(dst)..Z(dst+1)): as unsigned integers the patterns of non-negative
// floats order as the floats do, and Inf and NaN lie above 0x7f7fffff.
func zAbsMaxBits(off, nv, dst int) {
	p("\tVPANDD %d(SI), Z31, Z%d", off, dst)
	for j := 1; j < nv; j++ {
		p("\tVPANDD %d(SI), Z31, Z%d", off+64*j, dst+1)
		p("\tVPMAXUD Z%d, Z%d, Z%d", dst+1, dst, dst)
	}
	p("\tVEXTRACTI64X4 $1, Z%d, Y%d", dst, dst+1)
	p("\tVPMAXUD Y%d, Y%d, Y%d", dst+1, dst, dst)
	p("\tVEXTRACTI128 $1, Y%d, X%d", dst, dst+1)
	p("\tVPMAXUD X%d, X%d, X%d", dst+1, dst, dst)
	p("\tVPSHUFD $0x4e, X%d, X%d", dst, dst+1)
	p("\tVPMAXUD X%d, X%d, X%d", dst+1, dst, dst)
	p("\tVPSHUFD $0xb1, X%d, X%d", dst, dst+1)
	p("\tVPMAXUD X%d, X%d, X%d", dst+1, dst, dst)
}

// tinyMax is the bit pattern of 2^−119 (1.5e-36): blocks whose largest
// magnitude is below it go to the Go quantizers, because 127 over it would
// overflow to Inf (at 3.7e-37) and Go and VCVTPS2DQ convert the resulting
// NaN and Inf products to different integers.
const tinyMax = 0x04000000

// zQuantQ8K: q8kBlock (ggml's quantize_row_q8_K) of one 256-value block
// with AVX-512: the largest magnitude as integer maxima of the
// absolute-value bits, the first value of that magnitude (its sign makes
// the scale −127/max), the values times the scale rounded to nearest even
// (VCVTPS2DQ, as Go's RoundToEven of the float32 product), capped at 127.
// ok is false, with nothing written, when a value is Inf or NaN or the
// block's largest magnitude is below tinyMax.
func zQuantQ8K() {
	const name = "q8kBlockAVX512"
	p("")
	p("// func %s(v *float32, q *int8) (d float32, ok bool)", name)
	p("TEXT ·%s(SB), NOSPLIT, $0-21", name)
	p("\tMOVQ v+0(FP), SI")
	p("\tMOVQ q+8(FP), DI")
	zConst(31, 0x7fffffff)
	zAbsMaxBits(0, 16, 0)
	p("\tVMOVD X0, AX")
	p("\tCMPL AX, $0x7f800000")
	p("\tJAE %s_bad", name)
	p("\tTESTL AX, AX")
	p("\tJNZ %s_scale", name)
	p("\tVPXORD Z1, Z1, Z1")
	for j := range 4 {
		p("\tVMOVDQU64 Z1, %d(DI)", 64*j)
	}
	p("\tMOVL $0, d+16(FP)")
	p("\tMOVB $1, ok+20(FP)")
	p("\tVZEROUPPER")
	p("\tRET")
	p("%s_scale:", name)
	p("\tCMPL AX, $0x%08x", tinyMax)
	p("\tJB %s_bad", name)
	p("\tVPBROADCASTD X0, Z0")
	for j := range 16 {
		p("\tVPANDD %d(SI), Z31, Z1", 64*j)
		p("\tVPCMPEQD Z0, Z1, K1")
		p("\tKMOVW K1, AX")
		p("\tTESTL AX, AX")
		p("\tJNZ %s_at%d", name, j)
	}
	p("\tJMP %s_bad", name) // unreachable: the maximum is one of the values
	for j := range 16 {
		p("%s_at%d:", name, j)
		p("\tTZCNTL AX, AX")
		p("\tVMOVSS %d(SI)(AX*4), X1", 64*j)
		p("\tJMP %s_found", name)
	}
	p("%s_found:", name)
	p("\tMOVL $0x%08x, AX", math.Float32bits(-127))
	p("\tVMOVD AX, X2")
	p("\tVDIVSS X1, X2, X2") // iscale = −127/max
	p("\tVBROADCASTSS X2, Z3")
	p("\tMOVL $127, AX")
	p("\tVPBROADCASTD AX, Z4")
	for j := range 16 {
		p("\tVMULPS %d(SI), Z3, Z5", 64*j)
		p("\tVCVTPS2DQ Z5, Z5")
		p("\tVPMINSD Z4, Z5, Z5")
		p("\tVPMOVSDB Z5, %d(DI)", 16*j)
	}
	p("\tMOVL $0x%08x, AX", math.Float32bits(1))
	p("\tVMOVD AX, X1")
	p("\tVDIVSS X2, X1, X1") // d = 1/iscale
	p("\tVMOVSS X1, d+16(FP)")
	p("\tMOVB $1, ok+20(FP)")
	p("\tVZEROUPPER")
	p("\tRET")
	p("%s_bad:", name)
	p("\tMOVB $0, ok+20(FP)")
	p("\tVZEROUPPER")
	p("\tRET")
}

// zQuantQ80: the quantization of q80Block (ggml-cpu's x86
// quantize_row_q8_0) for n 32-value blocks with AVX-512: per block the
// largest magnitude (as in zQuantQ8K), stored at amax, and the values
// times 127/amax (0 for an all-zero block) rounded to nearest even. ok is
// false when a value is Inf or NaN or a block's largest magnitude is below
// tinyMax (the blocks before it are written).
func zQuantQ80() {
	const name = "q80BlocksAVX512"
	p("")
	p("// func %s(v *float32, q *int8, amax *float32, n int) (ok bool)", name)
	p("TEXT ·%s(SB), NOSPLIT, $0-33", name)
	p("\tMOVQ v+0(FP), SI")
	p("\tMOVQ q+8(FP), DI")
	p("\tMOVQ amax+16(FP), BX")
	p("\tMOVQ n+24(FP), CX")
	zConst(31, 0x7fffffff)
	p("\tMOVL $0x%08x, DX", math.Float32bits(127))
	p("\tTESTQ CX, CX")
	p("\tJZ %s_done", name)
	p("%s_block:", name)
	zAbsMaxBits(0, 2, 0)
	p("\tVMOVD X0, AX")
	p("\tCMPL AX, $0x7f800000")
	p("\tJAE %s_bad", name)
	p("\tVMOVSS X0, (BX)")
	p("\tVXORPS X2, X2, X2") // id = 0 for an all-zero block
	p("\tTESTL AX, AX")
	p("\tJZ %s_id", name)
	p("\tCMPL AX, $0x%08x", tinyMax)
	p("\tJB %s_bad", name)
	p("\tVMOVD DX, X2")
	p("\tVDIVSS X0, X2, X2") // id = 127/amax
	p("%s_id:", name)
	p("\tVBROADCASTSS X2, Z2")
	for j := range 2 {
		p("\tVMULPS %d(SI), Z2, Z3", 64*j)
		p("\tVCVTPS2DQ Z3, Z3")
		p("\tVPMOVSDB Z3, %d(DI)", 16*j)
	}
	p("\tADDQ $128, SI")
	p("\tADDQ $32, DI")
	p("\tADDQ $4, BX")
	p("\tDECQ CX")
	p("\tJNZ %s_block", name)
	p("%s_done:", name)
	p("\tMOVB $1, ok+32(FP)")
	p("\tVZEROUPPER")
	p("\tRET")
	p("%s_bad:", name)
	p("\tMOVB $0, ok+32(FP)")
	p("\tVZEROUPPER")
	p("\tRET")
}

// zGemm: the integer GEMM's tile kernels (see gemm.go) for AVX-512 VNNI:
// c [6][32] += a tile of n blocks times a Q4_K or Q6_K panel. Z0–Z11 hold
// the block's scaled integer sums of the 6×32 outputs (two vectors of 16
// weight rows per activation row), Z12–Z23 a sub-block's sums (then the
// sums of the mins or offsets), Z24/Z25 the weight vectors, Z26 the
// broadcast activations. Per sub-block (subs of them, 64/subs steps of 4
// elements) the sums are multiplied by the sub-block's scales (VPMULLD)
// into Z0–Z11.
func zGemm(name string, q6 bool) {
	const tileBlock = (64*6 + 6 + 24 + 48) * 4 // bytes per block of a tile
	subs := 8
	if q6 {
		subs = 16
	}
	steps := 64 / subs
	gemmHeader(name)
	p("\tTESTQ CX, CX")
	p("\tJZ %s_done", name)
	p("%s_block:", name)
	zeroZ(0, 12)
	p("\tLEAQ %d(SI), R8", 64*32*4) // the scales
	p("\tMOVQ $%d, R9", subs)
	p("%s_sub:", name)
	zeroZ(12, 24)
	for t := range steps {
		gemmPairStep("VPDPBUSD", "SI", t*128, t*24)
	}
	p("\tVMOVDQU32 (R8), Z27")
	p("\tVMOVDQU32 64(R8), Z28")
	for i := range 6 {
		for j := range 2 {
			p("\tVPMULLD Z%d, Z%d, Z%d", 27+j, 12+2*i+j, 12+2*i+j)
			p("\tVPADDD Z%d, Z%d, Z%d", 12+2*i+j, 2*i+j, 2*i+j)
		}
	}
	p("\tADDQ $%d, SI", steps*128)
	p("\tADDQ $128, R8")
	p("\tADDQ $%d, DI", steps*24)
	p("\tDECQ R9")
	p("\tJNZ %s_sub", name)
	// R8: the mins (Q4_K) or paired scales (Q6_K); DI: the tile's d, then
	// its sums (per 32, then per 16).
	zeroZ(12, 24)
	pairs, sums := 4, 24
	if q6 {
		pairs, sums = 8, 24+96
	}
	for pr := range pairs {
		gemmPairStep("VPDPWSSD", "R8", pr*128, sums+pr*24)
	}
	p("\tVMOVUPS %d(R8), Z27", pairs*128)
	p("\tVMOVUPS %d(R8), Z28", pairs*128+64)
	if !q6 {
		p("\tVMOVUPS %d(R8), Z29", pairs*128+128)
		p("\tVMOVUPS %d(R8), Z30", pairs*128+192)
	}
	for i := range 6 {
		p("\tVBROADCASTSS %d(DI), Z31", 4*i)
		for j := range 2 {
			s, m := 2*i+j, 12+2*i+j
			if q6 { // Σ sc·q·a − 32·Σ sc·sums16
				p("\tVPSLLD $5, Z%d, Z%d", m, m)
				p("\tVPSUBD Z%d, Z%d, Z%d", m, s, s)
				p("\tVCVTDQ2PS Z%d, Z%d", s, s)
				p("\tVMULPS Z%d, Z%d, Z%d", 27+j, s, s)
			} else { // d·Σ sc·q·a − dmin·Σ m·sums
				p("\tVCVTDQ2PS Z%d, Z%d", s, s)
				p("\tVCVTDQ2PS Z%d, Z%d", m, m)
				p("\tVMULPS Z%d, Z%d, Z%d", 27+j, s, s)
				p("\tVFNMADD231PS Z%d, Z%d, Z%d", 29+j, m, s)
			}
			p("\tVFMADD213PS %s, Z31, Z%d", crow(i, j*64), s)
			p("\tVMOVUPS Z%d, %s", s, crow(i, j*64))
		}
	}
	kGemmNext(name, q6, tileBlock)
}

// kGemmNext ends a K-quant tile kernel's block (R8 at its mins or paired
// scales, DI at the tile block's d): SI and DI to the next blocks, the
// block loop, the return.
func kGemmNext(name string, q6 bool, tileBlock int) {
	next := 4*128 + 128 + 128 // mins, d, dmin
	if q6 {
		next = 8*128 + 128 // paired scales, d
	}
	p("\tLEAQ %d(R8), SI", next)
	p("\tADDQ $%d, DI", tileBlock-64*24)
	p("\tDECQ CX")
	p("\tJNZ %s_block", name)
	p("%s_done:", name)
	p("\tVZEROUPPER")
	p("\tRET")
}

// zGemm80: the integer GEMM's tile kernel for panels of a 32-element
// format (Q8_0, Q5_0, Q4_0, unpacked to bytes plus 1<<shift): per block
// the six rows' integer sums (Z12–Z23) less the tile's sums shifted by
// shift (the offset), converted, times the weights' scales (Z27/Z28) and
// the activations' (Z29) into float accumulators Z0–Z11, added to c at
// the end. The tiles hold plain sums, so one quantization of the
// activations serves all three formats.
func zGemm80(name string, shift int) {
	const panelBlock, tileBlock = (8*32 + 32) * 4, (8*6 + 12) * 4
	gemmHeader(name)
	zeroZ(0, 12)
	p("\tTESTQ CX, CX")
	p("\tJZ %s_done", name)
	p("%s_block:", name)
	zeroZ(12, 24)
	for t := range 8 {
		gemmPairStep("VPDPBUSD", "SI", t*128, t*24)
	}
	p("\tVMOVUPS 1024(SI), Z27")
	p("\tVMOVUPS 1088(SI), Z28")
	for i := range 6 {
		p("\tVPBROADCASTD %d(DI), Z30", 8*24+24+4*i)
		p("\tVPSLLD $%d, Z30, Z30", shift) // Σq times the weights' offset
		p("\tVBROADCASTSS %d(DI), Z29", 8*24+4*i)
		for j := range 2 {
			m := 12 + 2*i + j
			p("\tVPSUBD Z30, Z%d, Z%d", m, m)
			p("\tVCVTDQ2PS Z%d, Z%d", m, m)
			p("\tVMULPS Z%d, Z%d, Z%d", 27+j, m, m)
			p("\tVFMADD231PS Z29, Z%d, Z%d", m, 2*i+j)
		}
	}
	p("\tADDQ $%d, SI", panelBlock)
	p("\tADDQ $%d, DI", tileBlock)
	p("\tDECQ CX")
	p("\tJNZ %s_block", name)
	p("%s_done:", name)
	for i := range 12 {
		p("\tVADDPS %s, Z%d, Z%d", crow(i/2, 64*(i%2)), i, i)
		p("\tVMOVUPS Z%d, %s", i, crow(i/2, 64*(i%2)))
	}
	p("\tVZEROUPPER")
	p("\tRET")
}

// yGemm: the integer GEMM's tile kernel at the AVX2 level (no VNNI) for
// half a panel: the 16 weight rows of the panel words at SI (the caller
// passes the panel offset by 0 or 16 words, c by 0 or 16 floats) against a
// tile's six activation rows, into int32 accumulators Y0–Y11 (row i, half
// vector j: Y(2i+j)). Each step's 4 bytes of a weight row (Y12, 8 rows)
// against one activation row's 4 bytes broadcast (Y14) by VPMADDUBSW, the
// int16 pairs summed into int32 lanes by VPMADDWD — with the sub-block's
// scale for the K-quants (each row's int32 scale made a pair of int16 once
// per sub-block: Y13, Y15), with ones (Y15) for the 32-element formats.
// No int16 pair can saturate: weights below 64 (Q4_K, Q6_K+32, Q5_0+16,
// Q4_0+8) times activations of at most 128; Q8_0's weights (stored +128)
// are made signed again and multiplied as |w| against x·sign(w) (VPSIGNB,
// the activations of a Q8_0 tile lie in [−127, 127]). Per 256 elements
// (K-quants; the mins or the offset 32 from the tile's sums) or per 32
// (the others; the offset from the tile's sums) the sums are converted,
// scaled by the weights' d, and added to c with the activations' d in one
// fused multiply-add.
func yGemm(name string, t int) {
	const q4k, q6k = 0, 1 // t: Q4_K, Q6_K, or the 32-element shift (7: Q8_0, 4: Q5_0, 3: Q4_0)
	gemmHeader(name)
	p("\tTESTQ CX, CX")
	p("\tJZ %s_done", name)
	step := func(wOff, aOff, sc0, sc1 int, q80 bool) {
		for v := range 2 {
			p("\tVMOVDQU %d(SI), Y12", wOff+32*v)
			if q80 {
				p("\tVPXOR ·yConsts+192(SB), Y12, Y12")
				p("\tVPABSB Y12, Y13")
			}
			for i := range 6 {
				p("\tVPBROADCASTD %d(DI), Y14", aOff+4*i)
				if q80 {
					p("\tVPSIGNB Y12, Y14, Y14")
					p("\tVPMADDUBSW Y14, Y13, Y14")
				} else {
					p("\tVPMADDUBSW Y14, Y12, Y14")
				}
				sc := sc0
				if v == 1 {
					sc = sc1
				}
				p("\tVPMADDWD Y%d, Y14, Y14", sc)
				p("\tVPADDD Y14, Y%d, Y%d", 2*i+v, 2*i+v)
			}
		}
	}
	zero := func() {
		for r := range 12 {
			p("\tVPXOR Y%d, Y%d, Y%d", r, r, r)
		}
	}
	if t > q6k { // the 32-element formats
		const panelBlock, tileBlock = (8*32 + 32) * 4, (8*6 + 12) * 4
		q80 := t == 7
		p("\tVMOVDQU ·yConsts+0(SB), Y15")
		p("%s_block:", name)
		zero()
		for st := range 8 {
			step(st*128, st*24, 15, 15, q80)
		}
		for i := range 6 {
			p("\tVBROADCASTSS %d(DI), Y14", 8*24+4*i)
			if !q80 {
				p("\tVPBROADCASTD %d(DI), Y13", 8*24+24+4*i)
				p("\tVPSLLD $%d, Y13, Y13", t) // Σq times the weights' offset
			}
			for v := range 2 {
				a := 2*i + v
				if !q80 {
					p("\tVPSUBD Y13, Y%d, Y%d", a, a)
				}
				p("\tVCVTDQ2PS Y%d, Y%d", a, a)
				p("\tVMULPS %d(SI), Y%d, Y%d", 1024+32*v, a, a)
				p("\tVFMADD213PS %s, Y14, Y%d", crow(i, 32*v), a)
				p("\tVMOVUPS Y%d, %s", a, crow(i, 32*v))
			}
		}
		p("\tADDQ $%d, SI", panelBlock)
		p("\tADDQ $%d, DI", tileBlock)
		p("\tDECQ CX")
		p("\tJNZ %s_block", name)
		p("%s_done:", name)
		p("\tVZEROUPPER")
		p("\tRET")
		return
	}
	const tileBlock = (64*6 + 6 + 24 + 48) * 4
	q6 := t == q6k
	subs := 8
	if q6 {
		subs = 16
	}
	steps := 64 / subs
	p("%s_block:", name)
	zero()
	p("\tLEAQ %d(SI), R8", 64*32*4) // the scales
	p("\tMOVQ $%d, R9", subs)
	p("%s_sub:", name)
	for v, reg := range []int{13, 15} { // the sub-block's scales as int16 pairs
		p("\tVMOVDQU %d(R8), Y%d", 32*v, reg)
		p("\tVPSLLD $16, Y%d, Y14", reg)
		p("\tVPBLENDW $0xaa, Y14, Y%d, Y%d", reg, reg)
	}
	for st := range steps {
		step(st*128, st*24, 13, 15, false)
	}
	p("\tADDQ $%d, SI", steps*128)
	p("\tADDQ $128, R8")
	p("\tADDQ $%d, DI", steps*24)
	p("\tDECQ R9")
	p("\tJNZ %s_sub", name)
	// R8: the mins (Q4_K) or paired scales (Q6_K); DI: the tile's d, then
	// its sums (per 32, then per 16).
	pairs, sums := 4, 24
	if q6 {
		pairs, sums = 8, 24+96
	}
	for i := range 6 {
		p("\tVPXOR Y12, Y12, Y12")
		p("\tVPXOR Y13, Y13, Y13")
		for pr := range pairs {
			p("\tVPBROADCASTD %d(DI), Y14", sums+pr*24+4*i)
			p("\tVPMADDWD %d(R8), Y14, Y15", pr*128)
			p("\tVPADDD Y15, Y12, Y12")
			p("\tVPMADDWD %d(R8), Y14, Y15", pr*128+32)
			p("\tVPADDD Y15, Y13, Y13")
		}
		p("\tVBROADCASTSS %d(DI), Y14", 4*i)
		for v := range 2 {
			a, m := 2*i+v, 12+v
			if q6 { // Σ sc·q·a − 32·Σ sc·sums16
				p("\tVPSLLD $5, Y%d, Y%d", m, m)
				p("\tVPSUBD Y%d, Y%d, Y%d", m, a, a)
				p("\tVCVTDQ2PS Y%d, Y%d", a, a)
				p("\tVMULPS %d(R8), Y%d, Y%d", pairs*128+32*v, a, a)
			} else { // d·Σ sc·q·a − dmin·Σ m·sums
				p("\tVCVTDQ2PS Y%d, Y%d", a, a)
				p("\tVCVTDQ2PS Y%d, Y%d", m, m)
				p("\tVMULPS %d(R8), Y%d, Y%d", pairs*128+32*v, a, a)
				p("\tVFNMADD231PS %d(R8), Y%d, Y%d", pairs*128+128+32*v, m, a)
			}
			p("\tVFMADD213PS %s, Y14, Y%d", crow(i, 32*v), a)
			p("\tVMOVUPS Y%d, %s", a, crow(i, 32*v))
		}
	}
	kGemmNext(name, q6, tileBlock)
}

// gemmHeader opens a tile kernel func name(w, a *uint32, c *float32, n,
// ldc int): w in SI, a in DI, c's row 0 in DX, n in CX, ldc·4 (bytes
// between c's rows) in R11 and c's row 3 in R10 (see crow).
func gemmHeader(name string) {
	p("")
	p("// func %s(w *uint32, a *uint32, c *float32, n, ldc int)", name)
	p("TEXT ·%s(SB), NOSPLIT, $0-40", name)
	p("\tMOVQ w+0(FP), SI")
	p("\tMOVQ a+8(FP), DI")
	p("\tMOVQ c+16(FP), DX")
	p("\tMOVQ n+24(FP), CX")
	p("\tMOVQ ldc+32(FP), R11")
	p("\tSHLQ $2, R11")
	p("\tLEAQ (R11)(R11*2), R10")
	p("\tADDQ DX, R10")
}

// crow is the operand of byte off in row i (0–5) of a tile kernel's c:
// rows 0–2 from DX, 3–5 from R10, ldc·4 bytes (R11) apart.
func crow(i, off int) string {
	base := "DX"
	if i >= 3 {
		base, i = "R10", i-3
	}
	switch i {
	case 0:
		return fmt.Sprintf("%d(%s)", off, base)
	case 1:
		return fmt.Sprintf("%d(%s)(R11*1)", off, base)
	}
	return fmt.Sprintf("%d(%s)(R11*2)", off, base)
}

// zeroZ clears Z[from, to).
func zeroZ(from, to int) {
	for r := from; r < to; r++ {
		p("\tVPXORD Z%d, Z%d, Z%d", r, r, r)
	}
}

// gemmPairStep is one step of zGemm: the weight vectors at wOff(wReg)
// (32 rows' words) against the six activation rows' words at aOff(DI),
// broadcast, accumulated by op into Z12–Z23.
func gemmPairStep(op, wReg string, wOff, aOff int) {
	p("\tVMOVDQU32 %d(%s), Z24", wOff, wReg)
	p("\tVMOVDQU32 %d(%s), Z25", wOff+64, wReg)
	for i := range 6 {
		p("\tVPBROADCASTD %d(DI), Z26", aOff+4*i)
		p("\t%s Z26, Z24, Z%d", op, 12+2*i)
		p("\t%s Z26, Z25, Z%d", op, 13+2*i)
	}
}
