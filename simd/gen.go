//go:build ignore

// gen writes kernels_amd64.s, the Go assembly of package simd, for two
// vector widths: AVX-512 (16 floats, 32 zmm registers) and AVX2+FMA (8
// floats, 16 ymm registers). Run it with `go generate ./simd`.
package main

import (
	"bytes"
	"fmt"
	"os"
)

// isa describes one vector width.
type isa struct {
	name  string // symbol suffix: 512 or 256
	reg   string // Z or Y
	lanes int    // floats per vector
	nregs int    // vector registers
	mrMax int    // micro-kernel rows
	nrVec int    // vectors per micro-kernel row (32 or 16 floats)
}

var (
	avx512 = isa{"512", "Z", 16, 32, 12, 2}
	avx2   = isa{"256", "Y", 8, 16, 6, 2}
)

var out bytes.Buffer

func p(format string, args ...any) { fmt.Fprintf(&out, format+"\n", args...) }

func (s isa) r(i int) string { return fmt.Sprintf("%s%d", s.reg, i) }
func (s isa) x(i int) string { return fmt.Sprintf("X%d", i) }
func (s isa) bytes() int     { return 4 * s.lanes }

// zero clears register i.
func (s isa) zero(i int) {
	if s.reg == "Z" {
		p("\tVPXORD %s, %s, %s", s.r(i), s.r(i), s.r(i))
	} else {
		p("\tVXORPS %s, %s, %s", s.r(i), s.r(i), s.r(i))
	}
}

// bcastConst broadcasts the float32 with bits v into register i.
func (s isa) bcastConst(i int, v uint32) {
	p("\tMOVL $0x%08x, AX", v)
	p("\tVMOVD AX, X%d", i)
	p("\tVBROADCASTSS X%d, %s", i, s.r(i))
}

// hsum reduces register i to its lane sum in X(i) (clobbers register t).
func (s isa) hsum(i, t int) {
	if s.reg == "Z" {
		p("\tVEXTRACTF64X4 $1, Z%d, Y%d", i, t)
		p("\tVADDPS Y%d, Y%d, Y%d", t, i, i)
	}
	p("\tVEXTRACTF128 $1, Y%d, X%d", i, t)
	p("\tVADDPS X%d, X%d, X%d", t, i, i)
	p("\tVHADDPS X%d, X%d, X%d", i, i, i)
	p("\tVHADDPS X%d, X%d, X%d", i, i, i)
}

// peak: 12 independent FMA chains, unrolled twice (24 FMAs per iteration).
func (s isa) peak() {
	p("// func peakFMA%s(n int)", s.name)
	p("TEXT ·peakFMA%s(SB), NOSPLIT, $0-8", s.name)
	p("\tMOVQ n+0(FP), CX")
	for i := range 14 {
		s.zero(i)
	}
	p("\tTESTQ CX, CX")
	p("\tJZ peak%sdone", s.name)
	p("peak%sloop:", s.name)
	for range 2 {
		for i := range 12 {
			p("\tVFMADD231PS %s, %s, %s", s.r(12), s.r(13), s.r(i))
		}
	}
	p("\tDECQ CX")
	p("\tJNZ peak%sloop", s.name)
	p("peak%sdone:", s.name)
	p("\tVZEROUPPER")
	p("\tRET")
	p("")
}

// kernel: c[mr×(nrVec·lanes)] (+)= a·b with a packed [k][mr] (or, when
// inPlace, row i at a+i*lda) and b rows of nrVec·lanes floats at stride ldb
// (floats). Short tiles (mr·nrVec < 8) keep several accumulator sets, one
// per k step of an unrolled loop, so that enough independent FMA chains
// hide the FMA latency; the sets are added at the end.
func (s isa) kernel(mr int, inPlace bool) {
	nv := s.nrVec
	bReg := s.nregs - 4 // nv B registers, then two broadcast registers
	sets := 1
	for mr*nv*sets < 8 && mr*nv*sets*2 <= bReg {
		sets *= 2
	}
	name, lbl := fmt.Sprintf("kern%s_%d", s.name, mr), fmt.Sprintf("k%s_%d", s.name, mr)
	bases := []string{"SI", "R12", "R13", "BX"}
	cOff := 32
	if inPlace {
		name, lbl = fmt.Sprintf("kernu%s_%d", s.name, mr), fmt.Sprintf("ku%s_%d", s.name, mr)
		cOff = 40
		p("// func %s(k int, a *float32, lda int, b *float32, ldb int, c *float32, ldc int, acc int)", name)
		p("TEXT ·%s(SB), NOSPLIT, $0-64", name)
		p("\tMOVQ k+0(FP), CX")
		p("\tMOVQ a+8(FP), SI")
		p("\tMOVQ lda+16(FP), R11")
		p("\tSHLQ $2, R11")
		p("\tMOVQ b+24(FP), DI")
		p("\tMOVQ ldb+32(FP), DX")
		p("\tSHLQ $2, DX")
		p("\tMOVQ c+40(FP), R8")
		p("\tMOVQ ldc+48(FP), R9")
		p("\tSHLQ $2, R9")
		p("\tMOVQ acc+56(FP), R10")
		for i := 1; i < (mr+2)/3; i++ {
			p("\tLEAQ (%s)(R11*2), %s", bases[i-1], bases[i])
			p("\tADDQ R11, %s", bases[i])
		}
	} else {
		p("// func %s(k int, a, b *float32, ldb int, c *float32, ldc int, acc int)", name)
		p("TEXT ·%s(SB), NOSPLIT, $0-56", name)
		p("\tMOVQ k+0(FP), CX")
		p("\tMOVQ a+8(FP), SI")
		p("\tMOVQ b+16(FP), DI")
		p("\tMOVQ ldb+24(FP), DX")
		p("\tSHLQ $2, DX")
		p("\tMOVQ c+32(FP), R8")
		p("\tMOVQ ldc+40(FP), R9")
		p("\tSHLQ $2, R9")
		p("\tMOVQ acc+48(FP), R10")
	}
	for i := range mr * nv * sets {
		s.zero(i)
	}
	// aAddr is the address of A's element (row i, k step u) from the
	// current position.
	aAddr := func(i, u int) string {
		if !inPlace {
			return fmt.Sprintf("%d(SI)", 4*(u*mr+i))
		}
		addr := fmt.Sprintf("%d(%s)", 4*u, bases[i/3])
		switch i % 3 {
		case 1:
			addr += "(R11*1)"
		case 2:
			addr += "(R11*2)"
		}
		return addr
	}
	advanceA := func(steps int) {
		if !inPlace {
			p("\tADDQ $%d, SI", 4*mr*steps)
			return
		}
		for i := range (mr + 2) / 3 {
			p("\tADDQ $%d, %s", 4*steps, bases[i])
		}
	}
	step := func(u, set int) {
		for v := range nv {
			p("\tVMOVUPS %d(DI), %s", v*s.bytes(), s.r(bReg+v))
		}
		p("\tADDQ DX, DI")
		for i := range mr {
			bc := bReg + nv + i%2
			p("\tVBROADCASTSS %s, %s", aAddr(i, u), s.r(bc))
			for v := range nv {
				p("\tVFMADD231PS %s, %s, %s", s.r(bReg+v), s.r(bc), s.r(set*mr*nv+i*nv+v))
			}
		}
	}
	if sets > 1 {
		p("\tCMPQ CX, $%d", sets)
		p("\tJLT %srest", lbl)
		p("%sunrolled:", lbl)
		for u := range sets {
			step(u, u)
		}
		advanceA(sets)
		p("\tSUBQ $%d, CX", sets)
		p("\tCMPQ CX, $%d", sets)
		p("\tJGE %sunrolled", lbl)
		p("%srest:", lbl)
	}
	p("\tTESTQ CX, CX")
	p("\tJZ %ssum", lbl)
	p("%sloop:", lbl)
	step(0, 0)
	advanceA(1)
	p("\tDECQ CX")
	p("\tJNZ %sloop", lbl)
	p("%ssum:", lbl)
	for set := 1; set < sets; set++ {
		for i := range mr * nv {
			p("\tVADDPS %s, %s, %s", s.r(set*mr*nv+i), s.r(i), s.r(i))
		}
	}
	p("\tTESTQ R10, R10")
	p("\tJZ %snoacc", lbl)
	for i := range mr {
		for v := range nv {
			p("\tVADDPS %d(R8), %s, %s", v*s.bytes(), s.r(i*nv+v), s.r(i*nv+v))
		}
		if i < mr-1 {
			p("\tADDQ R9, R8")
		}
	}
	p("\tMOVQ c+%d(FP), R8", cOff)
	p("%snoacc:", lbl)
	for i := range mr {
		for v := range nv {
			p("\tVMOVUPS %s, %d(R8)", s.r(i*nv+v), v*s.bytes())
		}
		if i < mr-1 {
			p("\tADDQ R9, R8")
		}
	}
	p("\tVZEROUPPER")
	p("\tRET")
	p("")
}

// loop emits a vector loop over n floats (CX), 1 vector per iteration,
// then a scalar tail: body(vec bool) emits one step on register width
// (vec) or scalar (X registers, 4 bytes). Pointers in ptrs advance.
func (s isa) loop(name string, ptrs []string, body func(vec bool)) {
	p("\tMOVQ CX, BX")
	p("\tSHRQ $%d, BX", log2(s.lanes))
	p("\tANDQ $%d, CX", s.lanes-1)
	p("\tTESTQ BX, BX")
	p("\tJZ %svtail", name)
	p("%svloop:", name)
	body(true)
	for _, r := range ptrs {
		p("\tADDQ $%d, %s", s.bytes(), r)
	}
	p("\tDECQ BX")
	p("\tJNZ %svloop", name)
	p("%svtail:", name)
	p("\tTESTQ CX, CX")
	p("\tJZ %sdone", name)
	p("%sstail:", name)
	body(false)
	for _, r := range ptrs {
		p("\tADDQ $4, %s", r)
	}
	p("\tDECQ CX")
	p("\tJNZ %sstail", name)
	p("%sdone:", name)
}

func log2(n int) int {
	l := 0
	for 1<<l < n {
		l++
	}
	return l
}

// v returns register i at vector width, or its X form when scalar.
func (s isa) v(i int, vec bool) string {
	if vec {
		return s.r(i)
	}
	return s.x(i)
}

// sfx is the instruction suffix: PS for vectors, SS for scalars.
func sfx(vec bool) string {
	if vec {
		return "PS"
	}
	return "SS"
}

func (s isa) dot() {
	p("// func dot%s(a, b *float32, n int) float32", s.name)
	p("TEXT ·dot%s(SB), NOSPLIT, $0-28", s.name)
	p("\tMOVQ a+0(FP), SI")
	p("\tMOVQ b+8(FP), DI")
	p("\tMOVQ n+16(FP), CX")
	for i := range 4 {
		s.zero(i)
	}
	// Four vectors per iteration while at least 4·lanes remain.
	n := "dot" + s.name
	p("%sq:", n)
	p("\tCMPQ CX, $%d", 4*s.lanes)
	p("\tJLT %sr", n)
	for i := range 4 {
		p("\tVMOVUPS %d(SI), %s", i*s.bytes(), s.r(4+i))
		p("\tVFMADD231PS %d(DI), %s, %s", i*s.bytes(), s.r(4+i), s.r(i))
	}
	p("\tADDQ $%d, SI", 4*s.bytes())
	p("\tADDQ $%d, DI", 4*s.bytes())
	p("\tSUBQ $%d, CX", 4*s.lanes)
	p("\tJMP %sq", n)
	p("%sr:", n)
	p("\tVXORPS X6, X6, X6")
	s.loop(n, []string{"SI", "DI"}, func(vec bool) {
		if vec {
			p("\tVMOVUPS (SI), %s", s.r(4))
			p("\tVFMADD231PS (DI), %s, %s", s.r(4), s.r(0))
		} else {
			p("\tVMOVSS (SI), X4")
			p("\tVMOVSS (DI), X5")
			p("\tVFMADD231SS X5, X4, X6")
		}
	})
	p("\tVADDPS %s, %s, %s", s.r(1), s.r(0), s.r(0))
	p("\tVADDPS %s, %s, %s", s.r(3), s.r(2), s.r(2))
	p("\tVADDPS %s, %s, %s", s.r(2), s.r(0), s.r(0))
	s.hsum(0, 1)
	p("\tVADDSS X6, X0, X0")
	p("\tVMOVSS X0, ret+24(FP)")
	p("\tVZEROUPPER")
	p("\tRET")
	p("")
}

// dotRows: dst[t] = q·k[t*ldk:][:hd] for t < n.
func (s isa) dotRows() {
	p("// func dotRows%s(dst, q, k *float32, ldk, n, hd int)", s.name)
	p("TEXT ·dotRows%s(SB), NOSPLIT, $0-48", s.name)
	p("\tMOVQ dst+0(FP), DI")
	p("\tMOVQ q+8(FP), SI")
	p("\tMOVQ k+16(FP), DX")
	p("\tMOVQ ldk+24(FP), R8")
	p("\tSHLQ $2, R8")
	p("\tMOVQ n+32(FP), R9")
	p("\tMOVQ hd+40(FP), R10")
	n := "dotrows" + s.name
	p("\tTESTQ R9, R9")
	p("\tJZ %send", n)
	p("%srow:", n)
	s.zero(0)
	p("\tVXORPS X6, X6, X6")
	p("\tMOVQ SI, AX")
	p("\tMOVQ DX, R11")
	p("\tMOVQ R10, CX")
	s.loop(n, []string{"AX", "R11"}, func(vec bool) {
		if vec {
			p("\tVMOVUPS (AX), %s", s.r(1))
			p("\tVFMADD231PS (R11), %s, %s", s.r(1), s.r(0))
		} else {
			p("\tVMOVSS (AX), X4")
			p("\tVMOVSS (R11), X5")
			p("\tVFMADD231SS X5, X4, X6")
		}
	})
	s.hsum(0, 1)
	p("\tVADDSS X6, X0, X0")
	p("\tVMOVSS X0, (DI)")
	p("\tADDQ $4, DI")
	p("\tADDQ R8, DX")
	p("\tDECQ R9")
	p("\tJNZ %srow", n)
	p("%send:", n)
	p("\tVZEROUPPER")
	p("\tRET")
	p("")
}

// dotRows16 (AVX-512): dst[t] = q·k[t*ldk:][:hd] for 16·blocks rows, hd a
// multiple of 16. Sixteen rows at a time: register j accumulates row
// (j%4)·4 + j/4 (so that the reduction below leaves the rows in order),
// then four shuffle-and-add stages reduce the 16 vectors to one vector of
// 16 row sums, stored at once. With f16 (dotRows16h_512) k's rows are
// IEEE halves, each chunk converted (VCVTPH2PS) into a register before its
// FMA: the same operations on the same values as converting the rows to
// float32 first, so the same bits.
func dotRows16(f16 bool) {
	name, kt, elt := "dotRows16_512", "*float32", 4
	if f16 {
		name, kt, elt = "dotRows16h_512", "*uint16", 2
	}
	p("// func %s(dst, q *float32, k %s, ldk, blocks, hd int)", name, kt)
	p("TEXT ·%s(SB), NOSPLIT, $0-48", name)
	p("\tMOVQ dst+0(FP), DI")
	p("\tMOVQ q+8(FP), SI")
	p("\tMOVQ k+16(FP), DX")
	p("\tMOVQ ldk+24(FP), R8")
	p("\tSHLQ $%d, R8", elt/2)
	p("\tLEAQ (R8)(R8*2), R9") // 3·ldk
	p("\tMOVQ blocks+32(FP), BX")
	p("\tMOVQ hd+40(FP), R10")
	p("\tSHLQ $2, R10") // hd in bytes
	lbl := "dr16"
	if f16 {
		lbl = "dr16h"
	}
	p("\tTESTQ BX, BX")
	p("\tJZ %sdone", lbl)
	p("%sblock:", lbl)
	bases := []string{"R11", "R12", "R13", "AX"}
	p("\tMOVQ DX, R11")
	p("\tLEAQ (R11)(R8*4), R12")
	p("\tLEAQ (R12)(R8*4), R13")
	p("\tLEAQ (R13)(R8*4), AX")
	for j := range 16 {
		p("\tVPXORD Z%d, Z%d, Z%d", j, j, j)
	}
	p("\tMOVQ R10, CX")
	p("\tSHRQ $6, CX") // chunks of 16 floats
	p("%schunk:", lbl)
	p("\tVMOVUPS (SI), Z16")
	for j := range 16 {
		a, b := j%4, j/4
		addr := "(" + bases[a] + ")"
		switch b {
		case 1:
			addr += "(R8*1)"
		case 2:
			addr += "(R8*2)"
		case 3:
			addr += "(R9*1)"
		}
		if f16 {
			p("\tVCVTPH2PS %s, Z%d", addr, 17+j%4)
			p("\tVFMADD231PS Z%d, Z16, Z%d", 17+j%4, j)
			continue
		}
		p("\tVFMADD231PS %s, Z16, Z%d", addr, j)
	}
	p("\tADDQ $64, SI")
	for _, r := range bases {
		p("\tADDQ $%d, %s", 16*elt, r)
	}
	p("\tDECQ CX")
	p("\tJNZ %schunk", lbl)
	p("\tSUBQ R10, SI")
	// Reduction: 16 → 8 → 4 → 2 → 1 vectors.
	for i := range 8 {
		p("\tVSHUFF32X4 $0x44, Z%d, Z%d, Z16", 2*i+1, 2*i)
		p("\tVSHUFF32X4 $0xee, Z%d, Z%d, Z17", 2*i+1, 2*i)
		p("\tVADDPS Z17, Z16, Z%d", i)
	}
	for i := range 4 {
		p("\tVSHUFF32X4 $0x88, Z%d, Z%d, Z16", 2*i+1, 2*i)
		p("\tVSHUFF32X4 $0xdd, Z%d, Z%d, Z17", 2*i+1, 2*i)
		p("\tVADDPS Z17, Z16, Z%d", i)
	}
	for i := range 2 {
		p("\tVSHUFPS $0x44, Z%d, Z%d, Z16", 2*i+1, 2*i)
		p("\tVSHUFPS $0xee, Z%d, Z%d, Z17", 2*i+1, 2*i)
		p("\tVADDPS Z17, Z16, Z%d", i)
	}
	p("\tVSHUFPS $0x88, Z1, Z0, Z16")
	p("\tVSHUFPS $0xdd, Z1, Z0, Z17")
	p("\tVADDPS Z17, Z16, Z0")
	p("\tVMOVUPS Z0, (DI)")
	p("\tADDQ $64, DI")
	p("\tLEAQ (DX)(R8*8), DX")
	p("\tLEAQ (DX)(R8*8), DX")
	p("\tDECQ BX")
	p("\tJNZ %sblock", lbl)
	p("%sdone:", lbl)
	p("\tVZEROUPPER")
	p("\tRET")
	p("")
}

// axpyRowsC (AVX-512): out[:16·nc] += Σ_t w[t]·v[t*ldv:][:16·nc] for a
// head of nc vectors (nc <= 4) held in registers: four rows per iteration,
// each row into its own accumulator set, so 4·nc FMA chains run at once.
// With f16 (axpyRows<nc>h_512) v's rows are IEEE halves, each chunk
// converted into a register (Z24–Z31) before its FMA: the same bits as
// converting the rows first.
func axpyRowsC(nc int, f16 bool) {
	name, vt, elt := fmt.Sprintf("axpyRows%d_512", nc), "*float32", 4
	if f16 {
		name, vt, elt = fmt.Sprintf("axpyRows%dh_512", nc), "*uint16", 2
	}
	// fma adds row addr's chunk c (an address) times the broadcast weight
	// in register wr into accumulator acc.
	tmp := 0
	fma := func(addr string, wr, acc int) {
		if !f16 {
			p("\tVFMADD231PS %s, Z%d, Z%d", addr, wr, acc)
			return
		}
		p("\tVCVTPH2PS %s, Z%d", addr, 24+tmp%8)
		p("\tVFMADD231PS Z%d, Z%d, Z%d", 24+tmp%8, wr, acc)
		tmp++
	}
	p("// func %s(out, w *float32, v %s, ldv, n int)", name, vt)
	p("TEXT ·%s(SB), NOSPLIT, $0-40", name)
	p("\tMOVQ out+0(FP), DI")
	p("\tMOVQ w+8(FP), SI")
	p("\tMOVQ v+16(FP), R11")
	p("\tMOVQ ldv+24(FP), R8")
	p("\tSHLQ $%d, R8", elt/2)
	p("\tLEAQ (R8)(R8*2), R9")
	p("\tMOVQ n+32(FP), CX")
	for i := range 4 * nc {
		p("\tVPXORD Z%d, Z%d, Z%d", i, i, i)
	}
	p("\tMOVQ CX, BX")
	p("\tSHRQ $2, BX")
	p("\tANDQ $3, CX")
	p("\tTESTQ BX, BX")
	p("\tJZ %stail", name)
	p("%squad:", name)
	rows := []string{"(R11)", "(R11)(R8*1)", "(R11)(R8*2)", "(R11)(R9*1)"}
	for u := range 4 {
		p("\tVBROADCASTSS %d(SI), Z%d", 4*u, 20+u)
		for c := range nc {
			addr := rows[u]
			if c > 0 {
				addr = fmt.Sprintf("%d%s", 16*elt*c, rows[u])
			}
			fma(addr, 20+u, u*nc+c)
		}
	}
	p("\tADDQ $16, SI")
	p("\tLEAQ (R11)(R8*4), R11")
	p("\tDECQ BX")
	p("\tJNZ %squad", name)
	p("%stail:", name)
	p("\tTESTQ CX, CX")
	p("\tJZ %ssum", name)
	p("%sone:", name)
	p("\tVBROADCASTSS (SI), Z20")
	for c := range nc {
		fma(fmt.Sprintf("%d(R11)", 16*elt*c), 20, c)
	}
	p("\tADDQ $4, SI")
	p("\tADDQ R8, R11")
	p("\tDECQ CX")
	p("\tJNZ %sone", name)
	p("%ssum:", name)
	for c := range nc {
		p("\tVADDPS Z%d, Z%d, Z%d", nc+c, c, c)
		p("\tVADDPS Z%d, Z%d, Z%d", 3*nc+c, 2*nc+c, 2*nc+c)
		p("\tVADDPS Z%d, Z%d, Z%d", 2*nc+c, c, c)
		p("\tVADDPS %d(DI), Z%d, Z%d", 64*c, c, c)
		p("\tVMOVUPS Z%d, %d(DI)", c, 64*c)
	}
	p("\tVZEROUPPER")
	p("\tRET")
	p("")
}

// axpyRows: out[:hd] += Σ_t w[t]·v[t*ldv:][:hd] for t < n, one vector
// chunk of out at a time, accumulated in registers over t.
func (s isa) axpyRows() {
	p("// func axpyRows%s(out, w, v *float32, ldv, n, hd int)", s.name)
	p("TEXT ·axpyRows%s(SB), NOSPLIT, $0-48", s.name)
	p("\tMOVQ out+0(FP), DI")
	p("\tMOVQ v+16(FP), DX")
	p("\tMOVQ ldv+24(FP), R8")
	p("\tSHLQ $2, R8")
	p("\tMOVQ n+32(FP), R9")
	p("\tMOVQ hd+40(FP), R10")
	n := "axpyrows" + s.name
	p("\tTESTQ R9, R9")
	p("\tJZ %send", n)
	// Vector chunks.
	p("\tMOVQ R10, BX")
	p("\tSHRQ $%d, BX", log2(s.lanes))
	p("\tANDQ $%d, R10", s.lanes-1)
	p("\tTESTQ BX, BX")
	p("\tJZ %sscalar", n)
	p("%schunk:", n)
	p("\tMOVQ w+8(FP), SI")
	p("\tMOVQ DX, R11")
	p("\tMOVQ R9, CX")
	s.zero(0)
	s.zero(1)
	p("\tSHRQ $1, CX")
	p("\tJZ %sodd", n)
	p("%spair:", n)
	p("\tVBROADCASTSS (SI), %s", s.r(2))
	p("\tVFMADD231PS (R11), %s, %s", s.r(2), s.r(0))
	p("\tADDQ R8, R11")
	p("\tVBROADCASTSS 4(SI), %s", s.r(3))
	p("\tVFMADD231PS (R11), %s, %s", s.r(3), s.r(1))
	p("\tADDQ R8, R11")
	p("\tADDQ $8, SI")
	p("\tDECQ CX")
	p("\tJNZ %spair", n)
	p("%sodd:", n)
	p("\tTESTQ $1, R9")
	p("\tJZ %sflush", n)
	p("\tVBROADCASTSS (SI), %s", s.r(2))
	p("\tVFMADD231PS (R11), %s, %s", s.r(2), s.r(0))
	p("%sflush:", n)
	p("\tVADDPS %s, %s, %s", s.r(1), s.r(0), s.r(0))
	p("\tVADDPS (DI), %s, %s", s.r(0), s.r(0))
	p("\tVMOVUPS %s, (DI)", s.r(0))
	p("\tADDQ $%d, DI", s.bytes())
	p("\tADDQ $%d, DX", s.bytes())
	p("\tDECQ BX")
	p("\tJNZ %schunk", n)
	// Scalar tail elements, one at a time over all t.
	p("%sscalar:", n)
	p("\tTESTQ R10, R10")
	p("\tJZ %send", n)
	p("%selem:", n)
	p("\tMOVQ w+8(FP), SI")
	p("\tMOVQ DX, R11")
	p("\tMOVQ R9, CX")
	p("\tVMOVSS (DI), X0")
	p("%selemt:", n)
	p("\tVMOVSS (SI), X2")
	p("\tVFMADD231SS (R11), X2, X0")
	p("\tADDQ R8, R11")
	p("\tADDQ $4, SI")
	p("\tDECQ CX")
	p("\tJNZ %selemt", n)
	p("\tVMOVSS X0, (DI)")
	p("\tADDQ $4, DI")
	p("\tADDQ $4, DX")
	p("\tDECQ R10")
	p("\tJNZ %selem", n)
	p("%send:", n)
	p("\tVZEROUPPER")
	p("\tRET")
	p("")
}

// rotate emits rotF32 (float32 cos/sin and arithmetic) or rotF64 (float64
// cos/sin, products and sums in float64, rounded to float32 once): lo' =
// lo·c − hi·s, hi' = lo·s + hi·c, each product rounded separately (no FMA),
// so the results equal the pure-Go loops bit for bit.
func (s isa) rotate(f64 bool) {
	name := "rotF32" + s.name
	ctype := "float32"
	per, csz := s.lanes, 4 // elements per iteration, bytes per cos/sin element
	src, dst := s.reg, s.reg
	if f64 {
		name = "rotF64" + s.name
		ctype = "float64"
		per, csz = s.lanes/2, 8
		if s.reg == "Z" {
			src = "Y"
		} else {
			src = "X"
		}
	}
	p("// func %s(lo, hi *float32, cos, sin *%s, n int)", name, ctype)
	p("TEXT ·%s(SB), NOSPLIT, $0-40", name)
	p("\tMOVQ lo+0(FP), DI")
	p("\tMOVQ hi+8(FP), SI")
	p("\tMOVQ cos+16(FP), DX")
	p("\tMOVQ sin+24(FP), R8")
	p("\tMOVQ n+32(FP), CX")
	p("\tMOVQ CX, BX")
	p("\tSHRQ $%d, BX", log2(per))
	p("\tANDQ $%d, CX", per-1)
	p("\tTESTQ BX, BX")
	p("\tJZ %stail", name)
	p("%svec:", name)
	r := func(i int) string { return fmt.Sprintf("%s%d", dst, i) }
	h := func(i int) string { return fmt.Sprintf("%s%d", src, i) }
	if f64 {
		p("\tVCVTPS2PD (DI), %s", r(0))
		p("\tVCVTPS2PD (SI), %s", r(1))
		p("\tVMOVUPD (DX), %s", r(2))
		p("\tVMOVUPD (R8), %s", r(3))
	} else {
		p("\tVMOVUPS (DI), %s", r(0))
		p("\tVMOVUPS (SI), %s", r(1))
		p("\tVMOVUPS (DX), %s", r(2))
		p("\tVMOVUPS (R8), %s", r(3))
	}
	ps := "PS"
	if f64 {
		ps = "PD"
	}
	p("\tVMUL%s %s, %s, %s", ps, r(2), r(0), r(4)) // a·c
	p("\tVMUL%s %s, %s, %s", ps, r(3), r(1), r(5)) // b·s
	p("\tVSUB%s %s, %s, %s", ps, r(5), r(4), r(4)) // a·c − b·s
	p("\tVMUL%s %s, %s, %s", ps, r(3), r(0), r(6)) // a·s
	p("\tVMUL%s %s, %s, %s", ps, r(2), r(1), r(7)) // b·c
	p("\tVADD%s %s, %s, %s", ps, r(7), r(6), r(6)) // a·s + b·c
	if f64 {
		cvt := "VCVTPD2PS"
		if s.reg == "Y" {
			cvt = "VCVTPD2PSY"
		}
		p("\t%s %s, %s", cvt, r(4), h(4))
		p("\t%s %s, %s", cvt, r(6), h(6))
		p("\tVMOVUPS %s, (DI)", h(4))
		p("\tVMOVUPS %s, (SI)", h(6))
	} else {
		p("\tVMOVUPS %s, (DI)", r(4))
		p("\tVMOVUPS %s, (SI)", r(6))
	}
	p("\tADDQ $%d, DI", 4*per)
	p("\tADDQ $%d, SI", 4*per)
	p("\tADDQ $%d, DX", csz*per)
	p("\tADDQ $%d, R8", csz*per)
	p("\tDECQ BX")
	p("\tJNZ %svec", name)
	p("%stail:", name)
	p("\tTESTQ CX, CX")
	p("\tJZ %sdone", name)
	p("%sscalar:", name)
	ss := "SS"
	if f64 {
		ss = "SD"
		p("\tVCVTSS2SD (DI), X0, X0")
		p("\tVCVTSS2SD (SI), X1, X1")
		p("\tVMOVSD (DX), X2")
		p("\tVMOVSD (R8), X3")
	} else {
		p("\tVMOVSS (DI), X0")
		p("\tVMOVSS (SI), X1")
		p("\tVMOVSS (DX), X2")
		p("\tVMOVSS (R8), X3")
	}
	p("\tVMUL%s X2, X0, X4", ss)
	p("\tVMUL%s X3, X1, X5", ss)
	p("\tVSUB%s X5, X4, X4", ss)
	p("\tVMUL%s X3, X0, X6", ss)
	p("\tVMUL%s X2, X1, X7", ss)
	p("\tVADD%s X7, X6, X6", ss)
	if f64 {
		p("\tVCVTSD2SS X4, X4, X4")
		p("\tVCVTSD2SS X6, X6, X6")
	}
	p("\tVMOVSS X4, (DI)")
	p("\tVMOVSS X6, (SI)")
	p("\tADDQ $4, DI")
	p("\tADDQ $4, SI")
	p("\tADDQ $%d, DX", csz)
	p("\tADDQ $%d, R8", csz)
	p("\tDECQ CX")
	p("\tJNZ %sscalar", name)
	p("%sdone:", name)
	p("\tVZEROUPPER")
	p("\tRET")
	p("")
}

func (s isa) axpy() {
	p("// func axpy%s(alpha float32, x, y *float32, n int)", s.name)
	p("TEXT ·axpy%s(SB), NOSPLIT, $0-32", s.name)
	p("\tVBROADCASTSS alpha+0(FP), %s", s.r(0))
	p("\tMOVQ x+8(FP), SI")
	p("\tMOVQ y+16(FP), DI")
	p("\tMOVQ n+24(FP), CX")
	s.loop("axpy"+s.name, []string{"SI", "DI"}, func(vec bool) {
		if vec {
			p("\tVMOVUPS (DI), %s", s.r(1))
			p("\tVFMADD231PS (SI), %s, %s", s.r(0), s.r(1))
			p("\tVMOVUPS %s, (DI)", s.r(1))
		} else {
			p("\tVMOVSS (DI), X1")
			p("\tVMOVSS (SI), X2")
			p("\tVFMADD231SS X2, X0, X1")
			p("\tVMOVSS X1, (DI)")
		}
	})
	p("\tVZEROUPPER")
	p("\tRET")
	p("")
}

func (s isa) scale() {
	p("// func scale%s(x *float32, n int, s float32)", s.name)
	p("TEXT ·scale%s(SB), NOSPLIT, $0-20", s.name)
	p("\tMOVQ x+0(FP), SI")
	p("\tMOVQ n+8(FP), CX")
	p("\tVBROADCASTSS s+16(FP), %s", s.r(0))
	s.loop("scale"+s.name, []string{"SI"}, func(vec bool) {
		p("\tVMUL%s (SI), %s, %s", sfx(vec), s.v(0, vec), s.v(1, vec))
		p("\tVMOV%s %s, (SI)", map[bool]string{true: "UPS", false: "SS"}[vec], s.v(1, vec))
	})
	p("\tVZEROUPPER")
	p("\tRET")
	p("")
}

func (s isa) sumsq() {
	p("// func sumsq%s(x *float32, n int) float32", s.name)
	p("TEXT ·sumsq%s(SB), NOSPLIT, $0-20", s.name)
	p("\tMOVQ x+0(FP), SI")
	p("\tMOVQ n+8(FP), CX")
	s.zero(0)
	s.zero(6)
	s.loop("sumsq"+s.name, []string{"SI"}, func(vec bool) {
		if vec {
			p("\tVMOVUPS (SI), %s", s.r(1))
			p("\tVFMADD231PS %s, %s, %s", s.r(1), s.r(1), s.r(0))
		} else {
			p("\tVMOVSS (SI), X1")
			p("\tVFMADD231SS X1, X1, X6")
		}
	})
	s.hsum(0, 1)
	p("\tVADDSS X6, X0, X0")
	p("\tVMOVSS X0, ret+16(FP)")
	p("\tVZEROUPPER")
	p("\tRET")
	p("")
}

func (s isa) mulScale() {
	p("// func mulScale%s(dst, x, gain *float32, n int, s float32)", s.name)
	p("TEXT ·mulScale%s(SB), NOSPLIT, $0-36", s.name)
	p("\tMOVQ dst+0(FP), DI")
	p("\tMOVQ x+8(FP), SI")
	p("\tMOVQ gain+16(FP), DX")
	p("\tMOVQ n+24(FP), CX")
	p("\tVBROADCASTSS s+32(FP), %s", s.r(0))
	s.loop("mulscale"+s.name, []string{"DI", "SI", "DX"}, func(vec bool) {
		mov := map[bool]string{true: "VMOVUPS", false: "VMOVSS"}[vec]
		p("\t%s (SI), %s", mov, s.v(1, vec))
		p("\tVMUL%s %s, %s, %s", sfx(vec), s.v(0, vec), s.v(1, vec), s.v(1, vec))
		p("\t%s (DX), %s", mov, s.v(2, vec))
		p("\tVMUL%s %s, %s, %s", sfx(vec), s.v(2, vec), s.v(1, vec), s.v(1, vec))
		p("\t%s %s, (DI)", mov, s.v(1, vec))
	})
	p("\tVZEROUPPER")
	p("\tRET")
	p("")
}

func (s isa) maxf() {
	p("// func maxf%s(x *float32, n int) float32", s.name)
	p("TEXT ·maxf%s(SB), NOSPLIT, $0-20", s.name)
	p("\tMOVQ x+0(FP), SI")
	p("\tMOVQ n+8(FP), CX")
	s.bcastConst(0, 0xff800000) // -Inf
	p("\tVMOVAPS X0, X6")
	s.loop("maxf"+s.name, []string{"SI"}, func(vec bool) {
		if vec {
			p("\tVMAXPS (SI), %s, %s", s.r(0), s.r(0))
		} else {
			p("\tVMAXSS (SI), X6, X6")
		}
	})
	if s.reg == "Z" {
		p("\tVEXTRACTF64X4 $1, Z0, Y1")
		p("\tVMAXPS Y1, Y0, Y0")
	}
	p("\tVEXTRACTF128 $1, Y0, X1")
	p("\tVMAXPS X1, X0, X0")
	p("\tVPERMILPS $0x4e, X0, X1")
	p("\tVMAXPS X1, X0, X0")
	p("\tVPERMILPS $0xb1, X0, X1")
	p("\tVMAXPS X1, X0, X0")
	p("\tVMAXSS X6, X0, X0")
	p("\tVMOVSS X0, ret+16(FP)")
	p("\tVZEROUPPER")
	p("\tRET")
	p("")
}

// Registers of the exp2 constants (see expConsts).
const (
	rC5 = iota + 7
	rC4
	rC3
	rC2
	rC1
	rOne
	rLo
	rHi
	rBias
)

// expConsts loads the exp2 polynomial and clamps into registers 7..15.
func (s isa) expConsts() {
	s.bcastConst(rC5, 0x3aaec482) // 1.3333558e-3
	s.bcastConst(rC4, 0x3c1d9539) // 9.6181291e-3
	s.bcastConst(rC3, 0x3d635847) // 5.5504109e-2
	s.bcastConst(rC2, 0x3e75fdf0) // 2.4022651e-1
	s.bcastConst(rC1, 0x3f317218) // 6.9314718e-1
	s.bcastConst(rOne, 0x3f800000)
	s.bcastConst(rLo, 0xc2fc0000) // -126
	s.bcastConst(rHi, 0x42fc0000) // 126
	p("\tMOVL $127, AX")
	p("\tVMOVD AX, X%d", rBias)
	p("\tVPBROADCASTD X%d, %s", rBias, s.r(rBias))
}

// exp2 replaces register t by 2^t (clamped to [-126, 126]); registers
// t+1 and t+2 are scratch. vec selects the full width or one lane.
func (s isa) exp2(t int, vec bool) {
	r := func(i int) string { return s.v(i, vec) }
	// Packed forms work for one lane too (the upper lanes are ignored).
	w := func(i int) string {
		if vec {
			return s.r(i)
		}
		return s.x(i)
	}
	_ = r
	p("\tVMAXPS %s, %s, %s", w(rLo), w(t), w(t))
	p("\tVMINPS %s, %s, %s", w(rHi), w(t), w(t))
	p("\tVCVTPS2DQ %s, %s", w(t), w(t+1)) // n (round to nearest)
	p("\tVCVTDQ2PS %s, %s", w(t+1), w(t+2))
	p("\tVSUBPS %s, %s, %s", w(t+2), w(t), w(t)) // f = t - n
	p("\tVMOVAPS %s, %s", w(rC5), w(t+2))
	p("\tVFMADD213PS %s, %s, %s", w(rC4), w(t), w(t+2))
	p("\tVFMADD213PS %s, %s, %s", w(rC3), w(t), w(t+2))
	p("\tVFMADD213PS %s, %s, %s", w(rC2), w(t), w(t+2))
	p("\tVFMADD213PS %s, %s, %s", w(rC1), w(t), w(t+2))
	p("\tVFMADD213PS %s, %s, %s", w(rOne), w(t), w(t+2)) // p(f)
	p("\tVPADDD %s, %s, %s", w(rBias), w(t+1), w(t+1))
	p("\tVPSLLD $23, %s, %s", w(t+1), w(t+1)) // 2^n
	p("\tVMULPS %s, %s, %s", w(t+1), w(t+2), w(t))
}

func (s isa) expSum() {
	p("// func expSum%s(x *float32, n int, k, off float32) float32", s.name)
	p("TEXT ·expSum%s(SB), NOSPLIT, $0-28", s.name)
	p("\tMOVQ x+0(FP), SI")
	p("\tMOVQ n+8(FP), CX")
	s.expConsts()
	p("\tVBROADCASTSS k+16(FP), %s", s.r(5))
	p("\tVBROADCASTSS off+20(FP), %s", s.r(6))
	s.zero(0)
	p("\tVXORPS X4, X4, X4")
	s.loop("expsum"+s.name, []string{"SI"}, func(vec bool) {
		w := func(i int) string {
			if vec {
				return s.r(i)
			}
			return s.x(i)
		}
		if vec {
			p("\tVMOVUPS (SI), %s", s.r(1))
		} else {
			p("\tVMOVSS (SI), X1")
		}
		p("\tVFMSUB213PS %s, %s, %s", w(6), w(5), w(1)) // x·k − off
		s.exp2(1, vec)
		if vec {
			p("\tVMOVUPS %s, (SI)", s.r(1))
			p("\tVADDPS %s, %s, %s", s.r(1), s.r(0), s.r(0))
		} else {
			p("\tVMOVSS X1, (SI)")
			p("\tVADDSS X1, X4, X4")
		}
	})
	s.hsum(0, 1)
	p("\tVADDSS X4, X0, X0")
	p("\tVMOVSS X0, ret+24(FP)")
	p("\tVZEROUPPER")
	p("\tRET")
	p("")
}

func (s isa) swiglu() {
	p("// func swiglu%s(dst, gate, up *float32, n int)", s.name)
	p("TEXT ·swiglu%s(SB), NOSPLIT, $0-32", s.name)
	p("\tMOVQ dst+0(FP), DI")
	p("\tMOVQ gate+8(FP), SI")
	p("\tMOVQ up+16(FP), DX")
	p("\tMOVQ n+24(FP), CX")
	s.expConsts()
	s.bcastConst(6, 0xbfb8aa3b) // -log2(e)
	s.loop("swiglu"+s.name, []string{"DI", "SI", "DX"}, func(vec bool) {
		w := func(i int) string {
			if vec {
				return s.r(i)
			}
			return s.x(i)
		}
		mov := map[bool]string{true: "VMOVUPS", false: "VMOVSS"}[vec]
		p("\t%s (SI), %s", mov, w(0))
		p("\tVMULPS %s, %s, %s", w(6), w(0), w(1)) // -g·log2e
		s.exp2(1, vec)
		p("\tVADDPS %s, %s, %s", w(rOne), w(1), w(1))
		p("\tVDIVPS %s, %s, %s", w(1), w(0), w(0)) // g/(1+e^-g)
		p("\t%s (DX), %s", mov, w(2))
		p("\tVMULPS %s, %s, %s", w(2), w(0), w(0))
		p("\t%s %s, (DI)", mov, w(0))
	})
	p("\tVZEROUPPER")
	p("\tRET")
	p("")
}

// dotTile4x4 (AVX-512): dst[i*ldd+j] = a[i*lda:][:k]·b[j*ldb:][:k] for i,
// j < 4, k a multiple of 16. Sixteen accumulators (Z0-Z15, i*4+j); per 16
// elements it loads four vectors of a and four of b and runs 16 FMAs, so
// every load feeds four FMAs (a GEMV over a few rows stays FMA-bound where
// dotRows16's one-row pass is bound by its loads).
func dotTile4x4() {
	p("// func dotTile4x4_512(dst *float32, ldd int, a *float32, lda int, b *float32, ldb int, k int)")
	p("TEXT ·dotTile4x4_512(SB), NOSPLIT, $0-56")
	p("\tMOVQ dst+0(FP), DI")
	p("\tMOVQ ldd+8(FP), BX")
	p("\tSHLQ $2, BX")
	p("\tMOVQ a+16(FP), SI")
	p("\tMOVQ lda+24(FP), R8")
	p("\tSHLQ $2, R8")
	p("\tLEAQ (R8)(R8*2), R9")
	p("\tMOVQ b+32(FP), DX")
	p("\tMOVQ ldb+40(FP), R10")
	p("\tSHLQ $2, R10")
	p("\tLEAQ (R10)(R10*2), R11")
	p("\tMOVQ k+48(FP), CX")
	p("\tSHRQ $4, CX")
	for i := range 16 {
		p("\tVPXORD Z%d, Z%d, Z%d", i, i, i)
	}
	p("\tTESTQ CX, CX")
	p("\tJZ dt44sum")
	p("dt44loop:")
	rows := []string{"", "(R8*1)", "(R8*2)", "(R9*1)"}
	for i, r := range rows {
		p("\tVMOVUPS (SI)%s, Z%d", r, 16+i)
	}
	brows := []string{"", "(R10*1)", "(R10*2)", "(R11*1)"}
	for j, r := range brows {
		p("\tVMOVUPS (DX)%s, Z%d", r, 20+j)
	}
	for i := range 4 {
		for j := range 4 {
			p("\tVFMADD231PS Z%d, Z%d, Z%d", 20+j, 16+i, i*4+j)
		}
	}
	p("\tADDQ $64, SI")
	p("\tADDQ $64, DX")
	p("\tDECQ CX")
	p("\tJNZ dt44loop")
	p("dt44sum:")
	for i := range 4 {
		for j := range 4 {
			r := i*4 + j
			p("\tVEXTRACTF64X4 $1, Z%d, Y16", r)
			p("\tVADDPS Y16, Y%d, Y%d", r, r)
			p("\tVEXTRACTF32X4 $1, Y%d, X16", r)
			p("\tVADDPS X16, X%d, X%d", r, r)
			p("\tVHADDPS X%d, X%d, X%d", r, r, r)
			p("\tVHADDPS X%d, X%d, X%d", r, r, r)
			p("\tVMOVSS X%d, %d(DI)", i*4+j, 4*j)
		}
		p("\tADDQ BX, DI")
	}
	p("\tVZEROUPPER")
	p("\tRET")
	p("")
}

func main() {
	p("// Code generated by gen.go; DO NOT EDIT.")
	p("")
	p("//go:build amd64 && !noasm")
	p("")
	p("#include \"textflag.h\"")
	p("")
	for _, s := range []isa{avx512, avx2} {
		s.peak()
		for mr := 1; mr <= s.mrMax; mr++ {
			s.kernel(mr, false)
			s.kernel(mr, true)
		}
		s.dot()
		s.dotRows()
		s.axpyRows()
		s.axpy()
		s.scale()
		s.sumsq()
		s.mulScale()
		s.maxf()
		s.expSum()
		s.swiglu()
		s.rotate(false)
		s.rotate(true)
		if s.reg == "Z" {
			for _, f16 := range []bool{false, true} {
				dotRows16(f16)
				for nc := 1; nc <= 4; nc++ {
					axpyRowsC(nc, f16)
				}
			}
			dotTile4x4()
		}
	}
	var decl bytes.Buffer
	fmt.Fprintf(&decl, "// Code generated by gen.go; DO NOT EDIT.\n\n//go:build amd64 && !noasm\n\npackage simd\n")
	for _, s := range []isa{avx512, avx2} {
		for mr := 1; mr <= s.mrMax; mr++ {
			fmt.Fprintf(&decl, "\n// kern%s_%d is the %d-row micro-kernel of kernels_amd64.s.\n//\n//go:noescape\nfunc kern%s_%d(k int, a, b *float32, ldb int, c *float32, ldc int, acc int)\n", s.name, mr, mr, s.name, mr)
			fmt.Fprintf(&decl, "\n// kernu%s_%d is kern%s_%d reading A in place (rows at stride lda).\n//\n//go:noescape\nfunc kernu%s_%d(k int, a *float32, lda int, b *float32, ldb int, c *float32, ldc int, acc int)\n", s.name, mr, s.name, mr, s.name, mr)
		}
	}
	for name, data := range map[string][]byte{"kernels_amd64.s": out.Bytes(), "kernels_amd64.go": decl.Bytes()} {
		if err := os.WriteFile(name, data, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}
