package simd

import (
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// cpuTime is the process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// measurePeak runs the current level's peak loop on one goroutine for
// about 200 ms of CPU and returns GFLOP per CPU-second.
func measurePeak() float64 {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	PeakLoop(1 << 16) // warm up (clock ramp)
	var flops float64
	c0 := cpuTime()
	for cpuTime()-c0 < 200*time.Millisecond {
		flops += PeakLoop(1 << 20)
	}
	return flops / (cpuTime() - c0).Seconds() / 1e9
}

// BenchmarkPeakFP32 is the machine's FP32 peak per core at the current
// level's widest vectors: 12 independent FMA chains, reported as GFLOP
// per CPU-second of the benchmark's one goroutine.
func BenchmarkPeakFP32(b *testing.B) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.ReportAllocs()
	var flops float64
	c0 := cpuTime()
	for b.Loop() {
		flops += PeakLoop(1 << 16)
	}
	b.ReportMetric(flops/(cpuTime()-c0).Seconds()/1e9, "GFLOP/cpu-s")
	b.ReportMetric(flops/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

// report adds GFLOP per CPU-second and its fraction of peak.
func report(b *testing.B, flopsPerOp, peak float64, c0 time.Duration) {
	g := flopsPerOp * float64(b.N) / (cpuTime() - c0).Seconds() / 1e9
	b.ReportMetric(g, "GFLOP/cpu-s")
	b.ReportMetric(g/peak, "of_peak")
	b.ReportMetric(peak, "peak_GFLOP/s")
}

// BenchmarkGemm is the serial Gemm (one goroutine, so CPU time = wall) on
// the model's shapes: the projections of the default model (width 256:
// qkv, gateup, down) and of the previous 12-layer default (width 128:
// qkv12, gateup12, down12) at prefill (m = 1536, 256) and decode (m = 16,
// 1) sizes, in place and (decode) against weights packed once, each
// against the peak measured in the same run.
func BenchmarkGemm(b *testing.B) {
	peak := measurePeak()
	type shape struct {
		name    string
		m, k, n int
		packed  bool
	}
	var shapes []shape
	for _, m := range []int{1536, 256, 16, 1} {
		for _, p := range []struct {
			name string
			k, n int
		}{{"qkv", 256, 384}, {"gateup", 256, 1536}, {"down", 768, 256}, {"qkv12", 128, 256}, {"gateup12", 128, 640}, {"down12", 320, 128}} {
			shapes = append(shapes, shape{fmt.Sprintf("%s_m%d", p.name, m), m, p.k, p.n, false})
			if m <= 16 {
				shapes = append(shapes, shape{fmt.Sprintf("%s_m%d_packed", p.name, m), m, p.k, p.n, true})
			}
		}
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for _, s := range shapes {
		b.Run(s.name, func(b *testing.B) {
			a := randVec(1, s.m*s.k)
			w := randVec(2, s.k*s.n)
			c := make([]float32, s.m*s.n)
			pb := PackB(s.k, s.n, w, s.n, false)
			b.ReportAllocs()
			c0 := cpuTime()
			for b.Loop() {
				if s.packed {
					pb.Gemm(s.m, a, s.k, 0, s.n, c, s.n, false)
				} else {
					Gemm(s.m, s.n, s.k, a, s.k, w, s.n, false, c, s.n, false)
				}
			}
			report(b, 2*float64(s.m)*float64(s.k)*float64(s.n), peak, c0)
		})
	}
}

// BenchmarkAttention is Attention over a 2,048-token context for one head
// of 32: the causal prefill (tiles of 72 query rows, as the model's, at
// every offset, each row attending over its prefix) and the last 72 rows
// only.
func BenchmarkAttention(b *testing.B) {
	peak := measurePeak()
	const ctx, hd, tile = 2048, 32, 72
	q := randVec(1, ctx*hd)
	kt := randVec(2, hd*ctx)
	v := randVec(3, ctx*hd)
	out := make([]float32, ctx*hd)
	lim := make([]int, ctx)
	for i := range lim {
		lim[i] = i + 1
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.Run("causal_ctx2048", func(b *testing.B) {
		b.ReportAllocs()
		c0 := cpuTime()
		for b.Loop() {
			for r := 0; r < ctx; r += tile {
				nr := min(tile, ctx-r)
				Attention(nr, hd, q[r*hd:], hd, kt, ctx, v, hd, lim[r:r+nr], 0.18, out[r*hd:], hd)
			}
		}
		report(b, AttentionFLOPs(hd, lim), peak, c0)
	})
	b.Run("last72_ctx2048", func(b *testing.B) {
		b.ReportAllocs()
		c0 := cpuTime()
		for b.Loop() {
			Attention(tile, hd, q, hd, kt, ctx, v, hd, lim[ctx-tile:], 0.18, out, hd)
		}
		report(b, AttentionFLOPs(hd, lim[ctx-tile:]), peak, c0)
	})
}
