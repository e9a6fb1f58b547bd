package quant

import (
	"math/rand/v2"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// threadCPU is the calling thread's user+system CPU time (the benchmarks
// lock their goroutine to a thread): on a shared machine it measures the
// kernels' work where wall time also counts the other processes' turns.
func threadCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(1 /* RUSAGE_THREAD */, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchMatrix returns a rows×cols weight matrix of type typ quantized from
// normal data, and an activation row.
func benchMatrix(b *testing.B, typ Type, rows, cols int) ([]byte, []float32) {
	b.Helper()
	r := rand.New(rand.NewPCG(1, 2))
	w, err := QuantizeRows(typ, gauss(r, rows*cols, 0.02), cols)
	if err != nil {
		b.Fatal(err)
	}
	return w, gauss(r, cols, 1)
}

// meter measures a benchmark loop in wall and thread CPU time.
type meter struct {
	wall time.Time
	cpu  time.Duration
}

func startMeter(b *testing.B) meter {
	runtime.LockOSThread()
	b.Cleanup(runtime.UnlockOSThread)
	b.ReportAllocs()
	b.ResetTimer()
	return meter{time.Now(), threadCPU()}
}

// report adds the weight bytes streamed per second (GB/s, wall) and per
// CPU-second (GB/cpu-s), and the CPU nanoseconds per weight element.
func (m meter) report(b *testing.B, bytesPerOp, elemsPerOp int) {
	wall, cpu := time.Since(m.wall).Seconds(), (threadCPU() - m.cpu).Seconds()
	n := float64(b.N)
	if wall > 0 {
		b.ReportMetric(float64(bytesPerOp)*n/wall/1e9, "GB/s")
	}
	if cpu > 0 {
		b.ReportMetric(float64(bytesPerOp)*n/cpu/1e9, "GB/cpu-s")
		b.ReportMetric(cpu*1e9/n/float64(elemsPerOp), "cpu-ns/elem")
	}
}

// BenchmarkDotRows is the decode matrix-vector product of a 2048×2048
// weight with one activation row, per type (one goroutine).
func BenchmarkDotRows(b *testing.B) {
	const n = 2048
	for _, typ := range allTypes {
		b.Run(typ.String(), func(b *testing.B) {
			w, x := benchMatrix(b, typ, n, n)
			rb := mustRowBytes(b, typ, n)
			dst := make([]float32, n)
			m := startMeter(b)
			for range b.N {
				DotRows(typ, dst, w, rb, x)
			}
			m.report(b, len(w), n*n)
		})
	}
}

// BenchmarkDequantizeRows decodes a 64-row tile of a 2048-wide weight (the
// prefill path's panel), per type.
func BenchmarkDequantizeRows(b *testing.B) {
	const n, rows = 2048, 64
	for _, typ := range allTypes {
		b.Run(typ.String(), func(b *testing.B) {
			w, _ := benchMatrix(b, typ, rows, n)
			dst := make([]float32, rows*n)
			m := startMeter(b)
			for range b.N {
				if err := DequantizeRows(typ, w, n, 0, rows, dst); err != nil {
					b.Fatal(err)
				}
			}
			m.report(b, len(w), rows*n)
		})
	}
}

// BenchmarkQuantize quantizes a 2048-element row (the test-file writer's
// cost), per type.
func BenchmarkQuantize(b *testing.B) {
	const n = 2048
	r := rand.New(rand.NewPCG(1, 2))
	x := gauss(r, n, 1)
	for _, typ := range allTypes {
		b.Run(typ.String(), func(b *testing.B) {
			dst := make([]byte, mustRowBytes(b, typ, n))
			b.ReportAllocs()
			for range b.N {
				if err := Quantize(typ, x, dst); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
