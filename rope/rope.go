package rope

import (
	"fmt"
	"math"

	"github.com/cacheblend/cacheblend/simd"
)

// DefaultTheta is the rotary base [New] uses when given theta <= 0 (the
// Llama default).
const DefaultTheta = 10000.0

// RoPE applies rotary position embeddings in the "rotate half" layout used by
// Llama (Hugging Face convention): dimension i is paired with i+HeadDim/2 and
// rotated by pos*theta^(-2i/HeadDim). Rotations compose, so moving a key
// computed at position p0 to position p1 (re-RoPE) is a rotation by p1-p0.
// A RoPE is immutable after New and safe for concurrent use.
type RoPE struct {
	headDim int
	invFreq []float64
}

// New returns the rotary embedding for heads of size headDim (even) with
// base theta ([DefaultTheta] when theta <= 0).
func New(headDim int, theta float64) *RoPE {
	if theta <= 0 {
		theta = DefaultTheta
	}
	half := headDim / 2
	inv := make([]float64, half)
	for i := range half {
		inv[i] = math.Pow(theta, -2*float64(i)/float64(headDim))
	}
	return &RoPE{headDim: headDim, invFreq: inv}
}

// Options are the RoPE variants of model files (the zero value is plain
// RoPE).
type Options struct {
	// FreqScale multiplies every frequency (linear RoPE scaling: 1/factor);
	// 0 means 1.
	FreqScale float64
	// FreqFactors divide the frequencies one by one (headDim/2 values, a
	// Llama 3.1+ file's rope_freqs.weight); nil means none.
	FreqFactors []float64
}

// NewWith returns the rotary embedding for heads of size headDim with base
// theta ([DefaultTheta] when theta <= 0) and the variants of o: frequency
// i is FreqScale·theta^(-2i/headDim)/FreqFactors[i], as llama.cpp computes
// it. FreqFactors must have headDim/2 values (others are ignored).
func NewWith(headDim int, theta float64, o Options) *RoPE {
	r := New(headDim, theta)
	if o.FreqScale > 0 && o.FreqScale != 1 {
		for i := range r.invFreq {
			r.invFreq[i] *= o.FreqScale
		}
	}
	if len(o.FreqFactors) == len(r.invFreq) {
		for i, f := range o.FreqFactors {
			r.invFreq[i] /= f
		}
	}
	return r
}

// FromInvFreq returns the rotary embedding for heads of size headDim with
// the given per-pair frequencies (headDim/2 finite values, as InvFreq
// returns them): how the blend server rebuilds a worker's exact RoPE. Bad
// input (a count that does not match, a non-finite value) is an error.
func FromInvFreq(headDim int, inv []float64) (*RoPE, error) {
	if headDim <= 0 || headDim%2 != 0 || len(inv) != headDim/2 {
		return nil, fmt.Errorf("rope: %d frequencies for heads of %d", len(inv), headDim)
	}
	for i, f := range inv {
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, fmt.Errorf("rope: frequency %d is %v", i, f)
		}
	}
	return &RoPE{headDim: headDim, invFreq: append([]float64(nil), inv...)}, nil
}

// InvFreq returns a copy of the per-pair frequencies (headDim/2 values):
// two RoPEs rotate alike exactly when these are equal.
func (r *RoPE) InvFreq() []float64 { return append([]float64(nil), r.invFreq...) }

// HeadDim is the head size this RoPE rotates.
func (r *RoPE) HeadDim() int { return r.headDim }

// RotateHeads rotates, in place, every head of x (len(x) a multiple of
// HeadDim) by the angle of position pos. A negative pos rotates backwards.
func (r *RoPE) RotateHeads(x []float32, pos int) {
	half := r.headDim / 2
	var cs, sn [256]float64
	var cosv, sinv []float64
	if half <= len(cs) {
		cosv, sinv = cs[:half], sn[:half]
	} else {
		cosv, sinv = make([]float64, half), make([]float64, half)
	}
	r.Angles(pos, cosv, sinv)
	r.RotateBy(x, cosv, sinv)
}

// Angles writes the cosines and sines of position pos's angles (HeadDim/2
// values each) into cos and sin: the numbers RotateHeads rotates by, for a
// caller that rotates many vectors at one position (every layer's Q and K
// of a token). It panics when cos or sin is shorter than HeadDim/2.
func (r *RoPE) Angles(pos int, cos, sin []float64) {
	p := float64(pos)
	cos, sin = cos[:len(r.invFreq)], sin[:len(r.invFreq)]
	for i, f := range r.invFreq {
		sin[i], cos[i] = math.Sincos(p * f)
	}
}

// RotateBy rotates, in place, every head of x (len(x) a multiple of
// HeadDim) by the angles whose cosines and sines Angles wrote: the same bits
// as RotateHeads at that position.
func (r *RoPE) RotateBy(x []float32, cos, sin []float64) {
	half := r.headDim / 2
	for h := 0; h+r.headDim <= len(x); h += r.headDim {
		simd.RotateF64(x[h:h+half], x[h+half:h+r.headDim], cos[:half], sin[:half])
	}
}

// Shift re-RoPEs x, rotating every head from position from to position to
// (a rotation by to-from).
//
// Shift is the blend server's re-RoPE hot path: the angles are computed in
// float64 once per call and the rotation itself runs in float32 over every
// head of x (which may hold many tokens) on simd's vector kernel (the same
// bits on every SIMD level), so its result may differ from RotateHeads in
// the last bits (well under 1e-6 relative).
func (r *RoPE) Shift(x []float32, from, to int) {
	if from == to {
		return
	}
	half := r.headDim / 2
	var cs, sn [256]float32
	var cosv, sinv []float32
	if half <= len(cs) {
		cosv, sinv = cs[:half], sn[:half]
	} else {
		cosv, sinv = make([]float32, half), make([]float32, half)
	}
	p := float64(to - from)
	for i := range half {
		s, c := math.Sincos(p * r.invFreq[i])
		sinv[i], cosv[i] = float32(s), float32(c)
	}
	hd := r.headDim
	for h := 0; h+hd <= len(x); h += hd {
		simd.Rotate(x[h:h+half], x[h+half:h+hd], cosv, sinv)
	}
}
