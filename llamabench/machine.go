package llamabench

import (
	"bufio"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/cacheblend/cacheblend/simd"
)

// Machine is what the benchmark ran on.
type Machine struct {
	CPU   string   // /proc/cpuinfo's model name
	Flags []string // the CPU flags the kernels of either engine use (avx2, fma, f16c, avx512*, avx_vnni, …)
	Cores int      // runtime.NumCPU
	SIMD  string   // package simd's level
	// PeakGFLOPs is the FP32 FMA peak of one core (simd.PeakLoop, as
	// BenchmarkPeakFP32 measures it), GFLOP/s.
	PeakGFLOPs float64
	// BandwidthGBs is the memory read bandwidth with Threads goroutines,
	// GB/s: the best of ten passes of simd.SumSquares over a buffer far
	// larger than the caches (1 GiB), each goroutine its own part.
	BandwidthGBs float64
	Threads      int
	// LlamaCPU is the llama.cpp CPU backend that ran (the prebuilt
	// libggml-cpu variant, e.g. zen4 or haswell), "" without llama.cpp.
	LlamaCPU string `json:",omitempty"`
}

var wantFlags = []string{"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512vbmi", "amx_int8", "amx_bf16"}

// DetectMachine reads the CPU's name and flags and measures its FP32 peak
// per core and its memory read bandwidth with threads goroutines (about 1 s,
// 1 GiB of memory held while it runs).
func DetectMachine(threads int) Machine {
	m := Machine{Cores: runtime.NumCPU(), SIMD: simd.Current().String(), Threads: threads}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<16), 1<<20)
		for sc.Scan() {
			k, v, ok := strings.Cut(sc.Text(), ":")
			if !ok {
				continue
			}
			switch strings.TrimSpace(k) {
			case "model name":
				if m.CPU == "" {
					m.CPU = strings.TrimSpace(v)
				}
			case "flags":
				if m.Flags == nil {
					have := strings.Fields(v)
					for _, w := range wantFlags {
						if slices.Contains(have, w) {
							m.Flags = append(m.Flags, w)
						}
					}
				}
			}
		}
		f.Close()
	}
	m.PeakGFLOPs = measurePeak()
	m.BandwidthGBs = measureBandwidth(threads, 1<<30)
	runtime.GC()
	debug.FreeOSMemory()
	return m
}

// RunBandwidth is the highest memory read bandwidth measured in a run (at
// its start, mc; before each file's runs; before the batch-1 decode, one
// reading for both engines when they alternated), the lowest and how many
// readings there were: decode as a fraction of the bandwidth divides by
// the highest, so a minute in which the shared machine's memory was slow
// does not inflate it.
func RunBandwidth(mc Machine, rs []Result) (high, low float64, n int) {
	high, low, n = mc.BandwidthGBs, mc.BandwidthGBs, 1
	add := func(v float64) {
		if v > 0 {
			high, low, n = max(high, v), min(low, v), n+1
		}
	}
	for _, r := range rs {
		add(r.BandwidthGBs)
		add(r.Ours.Decode1BandwidthGBs)
		if r.Llama != nil && r.Llama.Decode1BandwidthGBs != r.Ours.Decode1BandwidthGBs {
			add(r.Llama.Decode1BandwidthGBs) // its own reading (a run before the engines alternated)
		}
	}
	return high, low, n
}

// measurePeak runs simd's peak loop on one locked thread for ~200 ms and
// returns GFLOP/s (wall time: on a quiet machine, the thread's CPU time).
func measurePeak() float64 {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	simd.PeakLoop(1 << 16)
	var flops float64
	t0 := time.Now()
	for time.Since(t0) < 200*time.Millisecond {
		flops += simd.PeakLoop(1 << 20)
	}
	return flops / time.Since(t0).Seconds() / 1e9
}

// measureBandwidth reads a buffer of size bytes with threads goroutines,
// ten passes, and returns the best pass's GB/s. The buffer is an anonymous
// mapping, unmapped when it returns, so that a measurement between an
// engine's runs adds nothing to the resident memory they report (0 when
// it cannot be mapped).
func measureBandwidth(threads int, size int) float64 {
	threads = max(threads, 1)
	mem, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return 0
	}
	defer syscall.Munmap(mem)
	buf := unsafe.Slice((*float32)(unsafe.Pointer(&mem[0])), size/4)
	for i := range buf { // touch every page (and make them distinct)
		buf[i] = float32(i & 1023)
	}
	part := len(buf) / threads
	best := 0.0
	var sink [64]float32
	for range 10 {
		var wg sync.WaitGroup
		t0 := time.Now()
		for t := range threads {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sink[t] += simd.SumSquares(buf[t*part : (t+1)*part])
			}()
		}
		wg.Wait()
		if gbs := float64(part*threads*4) / time.Since(t0).Seconds() / 1e9; gbs > best {
			best = gbs
		}
	}
	runtime.KeepAlive(sink)
	return best
}
