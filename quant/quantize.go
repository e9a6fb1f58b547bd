package quant

import (
	"encoding/binary"
	"math"
)

// The quantizers are ports of ggml's reference quantizers
// (quantize_row_*_ref in ggml-quants.c, which llama-quantize runs when it
// has no importance matrix), operation for operation in float32: every
// product that feeds an addition is rounded on its own (the float32(…)
// conversions forbid fused multiply-adds, as a C build without -mfma
// does), so the blocks match ggml's byte for byte (TestGGMLQuantize checks
// this against the C code). Each takes whole rows (sizes checked by the
// caller) and finite values.

func quantF32(src []float32, dst []byte) {
	for i, v := range src {
		binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
	}
}

func quantF16(src []float32, dst []byte) {
	for i, v := range src {
		binary.LittleEndian.PutUint16(dst[2*i:], F32ToF16(v))
	}
}

func quantBF16(src []float32, dst []byte) {
	for i, v := range src {
		binary.LittleEndian.PutUint16(dst[2*i:], F32ToBF16(v))
	}
}

func putHalf(b []byte, f float32) { binary.LittleEndian.PutUint16(b, F32ToF16(f)) }

// nearestInt is ggml's nearest_int: round to nearest, ties to even, by
// the 1.5·2^23 trick (valid for |f| ≤ 4194303; larger values give the same
// garbage as in C, which ggml's callers clamp).
func nearestInt(f float32) int {
	v := f + 12582912
	return int(math.Float32bits(v)&0x007fffff) - 0x00400000
}

func abs32(f float32) float32 { return math.Float32frombits(math.Float32bits(f) &^ (1 << 31)) }

// truncInt8 is C's (int8_t) conversion of a float in range: truncation.
func truncInt8(f float32) int { return int(int8(f)) }

// absMax returns the element of largest magnitude (the first on ties) and
// that magnitude.
func absMax(x []float32) (mx, amax float32) {
	for _, v := range x {
		if a := abs32(v); amax < a {
			amax, mx = a, v
		}
	}
	return mx, amax
}

func minMax(x []float32) (mn, mx float32) {
	mn, mx = math.MaxFloat32, -math.MaxFloat32
	for _, v := range x {
		if v < mn {
			mn = v
		}
		if v > mx {
			mx = v
		}
	}
	return mn, mx
}

func quantQ4_0(src []float32, dst []byte) {
	for len(src) >= 32 {
		x := (*[32]float32)(src)
		y := (*[18]byte)(dst)
		mx, _ := absMax(x[:])
		d := mx / -8
		var id float32
		if d != 0 {
			id = 1 / d
		}
		putHalf(y[0:], d)
		for j := range 16 {
			x0 := float32(x[j] * id)
			x1 := float32(x[j+16] * id)
			y[2+j] = byte(min(15, truncInt8(x0+8.5))) | byte(min(15, truncInt8(x1+8.5)))<<4
		}
		src, dst = src[32:], dst[18:]
	}
}

func quantQ4_1(src []float32, dst []byte) {
	for len(src) >= 32 {
		x := (*[32]float32)(src)
		y := (*[20]byte)(dst)
		mn, mx := minMax(x[:])
		d := (mx - mn) / 15
		var id float32
		if d != 0 {
			id = 1 / d
		}
		putHalf(y[0:], d)
		putHalf(y[2:], mn)
		for j := range 16 {
			x0 := float32((x[j] - mn) * id)
			x1 := float32((x[j+16] - mn) * id)
			y[4+j] = byte(min(15, truncInt8(x0+0.5))) | byte(min(15, truncInt8(x1+0.5)))<<4
		}
		src, dst = src[32:], dst[20:]
	}
}

func quantQ5_0(src []float32, dst []byte) {
	for len(src) >= 32 {
		x := (*[32]float32)(src)
		y := (*[22]byte)(dst)
		mx, _ := absMax(x[:])
		d := mx / -16
		var id float32
		if d != 0 {
			id = 1 / d
		}
		putHalf(y[0:], d)
		var qh uint32
		for j := range 16 {
			x0 := float32(x[j] * id)
			x1 := float32(x[j+16] * id)
			xi0 := uint8(min(31, truncInt8(x0+16.5)))
			xi1 := uint8(min(31, truncInt8(x1+16.5)))
			y[6+j] = xi0&0xf | (xi1&0xf)<<4
			qh |= uint32(xi0&0x10) >> 4 << j
			qh |= uint32(xi1&0x10) >> 4 << (j + 16)
		}
		binary.LittleEndian.PutUint32(y[2:], qh)
		src, dst = src[32:], dst[22:]
	}
}

func quantQ5_1(src []float32, dst []byte) {
	for len(src) >= 32 {
		x := (*[32]float32)(src)
		y := (*[24]byte)(dst)
		mn, mx := minMax(x[:])
		d := (mx - mn) / 31
		var id float32
		if d != 0 {
			id = 1 / d
		}
		putHalf(y[0:], d)
		putHalf(y[2:], mn)
		var qh uint32
		for j := range 16 {
			x0 := float32((x[j] - mn) * id)
			x1 := float32((x[j+16] - mn) * id)
			xi0 := uint8(x0 + 0.5)
			xi1 := uint8(x1 + 0.5)
			y[8+j] = xi0&0xf | (xi1&0xf)<<4
			qh |= uint32(xi0&0x10) >> 4 << j
			qh |= uint32(xi1&0x10) >> 4 << (j + 16)
		}
		binary.LittleEndian.PutUint32(y[4:], qh)
		src, dst = src[32:], dst[24:]
	}
}

func quantQ8_0(src []float32, dst []byte) {
	for len(src) >= 32 {
		x := (*[32]float32)(src)
		y := (*[34]byte)(dst)
		var amax float32
		for _, v := range x {
			amax = max(amax, abs32(v))
		}
		d := amax / 127
		var id float32
		if d != 0 {
			id = 1 / d
		}
		putHalf(y[0:], d)
		for j, v := range x {
			y[2+j] = byte(int8(math.Round(float64(float32(v * id)))))
		}
		src, dst = src[32:], dst[34:]
	}
}

// makeQKX2 is ggml's make_qkx2_quants with use_mad false: the scale and
// (negated) min of an affine n-level fit of x under weights w, searching
// nstep+1 candidate scales; it writes the levels into L (laux is scratch).
func makeQKX2(nmax int, x, w []float32, L, laux []uint8, rmin, rdelta float32, nstep int) (scale, theMin float32) {
	n := len(x)
	mn, mx := x[0], x[0]
	sumW := w[0]
	sumX := float32(sumW * x[0])
	for i := 1; i < n; i++ {
		if x[i] < mn {
			mn = x[i]
		}
		if x[i] > mx {
			mx = x[i]
		}
		sumW += w[i]
		sumX += float32(w[i] * x[i])
	}
	if mn > 0 {
		mn = 0
	}
	if mx == mn {
		for i := range n {
			L[i] = 0
		}
		return 0, -mn
	}
	fmax := float32(nmax)
	iscale := fmax / (mx - mn)
	scale = 1 / iscale
	var bestErr float32
	for i := range n {
		l := nearestInt(float32(iscale * (x[i] - mn)))
		L[i] = uint8(max(0, min(nmax, l)))
		diff := float32(scale*float32(L[i])) + mn - x[i]
		bestErr += float32(w[i] * float32(diff*diff))
	}
	for is := 0; is <= nstep; is++ {
		iscale = (rmin + float32(rdelta*float32(is)) + fmax) / (mx - mn)
		var sumL, sumL2, sumXL float32
		for i := range n {
			l := nearestInt(float32(iscale * (x[i] - mn)))
			l = max(0, min(nmax, l))
			laux[i] = uint8(l)
			fl := float32(l)
			sumL += float32(w[i] * fl)
			sumL2 += float32(float32(w[i]*fl) * fl)
			sumXL += float32(float32(w[i]*fl) * x[i])
		}
		D := float32(sumW*sumL2) - float32(sumL*sumL)
		if D > 0 {
			thisScale := (float32(sumW*sumXL) - float32(sumX*sumL)) / D
			thisMin := (float32(sumL2*sumX) - float32(sumL*sumXL)) / D
			if thisMin > 0 {
				thisMin = 0
				thisScale = sumXL / sumL2
			}
			var curErr float32
			for i := range n {
				diff := float32(thisScale*float32(laux[i])) + thisMin - x[i]
				curErr += float32(w[i] * float32(diff*diff))
			}
			if curErr < bestErr {
				copy(L[:n], laux[:n])
				bestErr = curErr
				scale = thisScale
				mn = thisMin
			}
		}
	}
	return scale, -mn
}

// quantK4 is the shared body of ggml's quantize_row_q4_K_ref and
// quantize_row_q5_K_ref for one 256-element super-block: per 32-element
// sub-block an affine fit (makeQKX2), the scales and mins quantized to 6
// bits against the block's d and dmin (written into y[0:16]), then every
// element's level in 0..nmax into L.
func quantK4(x *[QK_K]float32, y []byte, L *[QK_K]uint8, nmax int, rmin float32, nstep int) {
	var scales, mins [8]float32
	var weights [32]float32
	var laux [32]uint8
	var maxScale, maxMin float32
	for j := range 8 {
		xs := x[32*j : 32*j+32]
		var sumX2 float32
		for _, v := range xs {
			sumX2 += float32(v * v)
		}
		avX := float32(math.Sqrt(float64(sumX2 / 32)))
		for l, v := range xs {
			weights[l] = avX + abs32(v)
		}
		scales[j], mins[j] = makeQKX2(nmax, xs, weights[:], L[32*j:32*j+32], laux[:], rmin, 0.1, nstep)
		maxScale = max(maxScale, scales[j])
		maxMin = max(maxMin, mins[j])
	}
	var invScale, invMin float32
	if maxScale > 0 {
		invScale = 63 / maxScale
	}
	if maxMin > 0 {
		invMin = 63 / maxMin
	}
	sc := (*[12]byte)(y[4:16])
	*sc = [12]byte{}
	for j := range 8 {
		ls := min(63, uint8(nearestInt(float32(invScale*scales[j]))))
		lm := min(63, uint8(nearestInt(float32(invMin*mins[j]))))
		if j < 4 {
			sc[j] = ls
			sc[j+4] = lm
		} else {
			sc[j+4] = ls&0xf | (lm&0xf)<<4
			sc[j-4] |= (ls >> 4) << 6
			sc[j] |= (lm >> 4) << 6
		}
	}
	putHalf(y[0:], maxScale/63)
	putHalf(y[2:], maxMin/63)
	dd, dmin := half(y[0:]), half(y[2:])
	for j := range 8 {
		s, m := scaleMinK4(j, sc)
		d := dd * float32(s)
		if d == 0 {
			continue
		}
		dm := dmin * float32(m)
		for ii := range 32 {
			l := nearestInt((x[32*j+ii] + dm) / d)
			L[32*j+ii] = uint8(max(0, min(nmax, l)))
		}
	}
}

func quantQ4_K(src []float32, dst []byte) {
	var L [QK_K]uint8
	for len(src) >= QK_K {
		y := (*[144]byte)(dst)
		quantK4((*[QK_K]float32)(src), y[:], &L, 15, -1, 20)
		for g := range 4 {
			q := (*[32]byte)(y[16+32*g:])
			for l := range 32 {
				q[l] = L[64*g+l] | L[64*g+l+32]<<4
			}
		}
		src, dst = src[QK_K:], dst[144:]
	}
}

func quantQ5_K(src []float32, dst []byte) {
	var L [QK_K]uint8
	for len(src) >= QK_K {
		y := (*[176]byte)(dst)
		quantK4((*[QK_K]float32)(src), y[:], &L, 31, -0.5, 15)
		qh := (*[32]byte)(y[16:48])
		*qh = [32]byte{}
		m1, m2 := uint8(1), uint8(2)
		for g := range 4 {
			ql := (*[32]byte)(y[48+32*g:])
			for j := range 32 {
				l1, l2 := L[64*g+j], L[64*g+j+32]
				if l1 > 15 {
					l1 -= 16
					qh[j] |= m1
				}
				if l2 > 15 {
					l2 -= 16
					qh[j] |= m2
				}
				ql[j] = l1 | l2<<4
			}
			m1 <<= 2
			m2 <<= 2
		}
		src, dst = src[QK_K:], dst[176:]
	}
}

// groupMaxEps is ggml's GROUP_MAX_EPS: a group whose largest magnitude is
// below it quantizes to zeros.
const groupMaxEps = 1e-15

// makeQX is ggml's make_qx_quants with rmse_type 1 and no importance
// weights: the scale of a symmetric fit of x to levels −nmax..nmax−1
// (stored in L offset by nmax), searching 18 scales around nmax/max.
func makeQX(nmax int, x []float32, L []int8) float32 {
	mx, amax := absMax(x)
	if amax < groupMaxEps {
		for i := range x {
			L[i] = 0
		}
		return 0
	}
	fmax := float32(nmax)
	iscale := -fmax / mx
	var sumLX, sumL2 float32
	for i, v := range x {
		l := nearestInt(float32(iscale * v))
		l = min(nmax-1, l)
		l = max(-nmax, l)
		L[i] = int8(l + nmax)
		w := float32(v * v)
		fl := float32(l)
		sumLX += float32(float32(w*v) * fl)
		sumL2 += float32(float32(w*fl) * fl)
	}
	var scale float32
	if sumL2 != 0 {
		scale = sumLX / sumL2
	}
	best := float32(scale * sumLX)
	for is := -9; is <= 9; is++ {
		if is == 0 {
			continue
		}
		iscale = -(fmax + float32(0.1*float32(is))) / mx
		sumLX, sumL2 = 0, 0
		for _, v := range x {
			l := nearestInt(float32(iscale * v))
			l = max(-nmax, min(nmax-1, l))
			w := float32(v * v)
			fl := float32(l)
			sumLX += float32(float32(w*v) * fl)
			sumL2 += float32(float32(w*fl) * fl)
		}
		if sumL2 > 0 && float32(sumLX*sumLX) > float32(best*sumL2) {
			for i, v := range x {
				l := nearestInt(float32(iscale * v))
				L[i] = int8(nmax + max(-nmax, min(nmax-1, l)))
			}
			scale = sumLX / sumL2
			best = float32(scale * sumLX)
		}
	}
	return scale
}

func quantQ6_K(src []float32, dst []byte) {
	var L [QK_K]int8
	var scales [16]float32
	for len(src) >= QK_K {
		x := (*[QK_K]float32)(src)
		y := (*[210]byte)(dst)
		var maxScale, maxAbsScale float32
		for ib := range 16 {
			s := makeQX(32, x[16*ib:16*ib+16], L[16*ib:16*ib+16])
			scales[ib] = s
			if a := abs32(s); a > maxAbsScale {
				maxAbsScale, maxScale = a, s
			}
		}
		if maxAbsScale < groupMaxEps {
			*y = [210]byte{}
			src, dst = src[QK_K:], dst[210:]
			continue
		}
		iscale := -128 / maxScale
		putHalf(y[208:], 1/iscale)
		sc := (*[16]byte)(y[192:208])
		for ib := range 16 {
			sc[ib] = byte(int8(min(127, nearestInt(float32(iscale*scales[ib])))))
		}
		dd := half(y[208:])
		for j := range 16 {
			d := dd * float32(int8(sc[j]))
			if d == 0 {
				continue
			}
			for ii := range 16 {
				l := nearestInt(x[16*j+ii] / d)
				L[16*j+ii] = int8(max(-32, min(31, l)) + 32)
			}
		}
		for n := range 2 {
			ql := (*[64]byte)(y[64*n:])
			qh := (*[32]byte)(y[128+32*n:])
			Ln := L[128*n : 128*n+128]
			for l := range 32 {
				q1, q2, q3, q4 := uint8(Ln[l]), uint8(Ln[l+32]), uint8(Ln[l+64]), uint8(Ln[l+96])
				ql[l] = q1&0xf | (q3&0xf)<<4
				ql[l+32] = q2&0xf | (q4&0xf)<<4
				qh[l] = q1>>4 | (q2>>4)<<2 | (q3>>4)<<4 | (q4>>4)<<6
			}
		}
		src, dst = src[QK_K:], dst[210:]
	}
}
