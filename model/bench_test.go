package model

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/kvcache"
	"github.com/cacheblend/cacheblend/reuseplan"
	"github.com/cacheblend/cacheblend/simd"
)

// cpuTime is the process's user+system CPU time (to tell a slow kernel from
// a busy machine).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func randMat(seed uint64, n int) []float32 {
	r := rand.New(rand.NewPCG(seed, 2))
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

// measurePeak runs simd's peak loop (independent FMA chains at the widest
// vector width of the current level) on one goroutine for about 200 ms of
// CPU and returns GFLOP per CPU-second: the per-core peak every kernel
// figure is divided by.
func measurePeak() float64 {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	simd.PeakLoop(1 << 16)
	var flops float64
	c0 := cpuTime()
	for cpuTime()-c0 < 200*time.Millisecond {
		flops += simd.PeakLoop(1 << 20)
	}
	return flops / (cpuTime() - c0).Seconds() / 1e9
}

// reportFLOPs adds GFLOP/s (wall, all threads), GFLOP per CPU-second and
// its fraction of peak (per CPU-second, so a busy machine or a second
// thread does not inflate it).
func reportFLOPs(b *testing.B, flopsPerOp, peak float64, cpu0 time.Duration) {
	g := flopsPerOp * float64(b.N) / (cpuTime() - cpu0).Seconds() / 1e9
	b.ReportMetric(flopsPerOp*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
	b.ReportMetric(g, "GFLOP/cpu-s")
	b.ReportMetric(g/peak, "of_peak")
}

// BenchmarkMatMul is the forward's matrix multiply (gemm: tiles on the
// model's threads, simd's kernel, weights packed at load) on the default
// model's projection shapes (M tokens × K in → N out) at prefill (1,536)
// and decode (16, 1) sizes; "go/" runs the same with the pure-Go kernels
// (simd level off). Each reports GFLOP per CPU-second and its fraction of
// the per-core peak measured at the start of the run.
func BenchmarkMatMul(b *testing.B) {
	peak := measurePeak()
	cfg := DefaultConfig()
	hd := cfg.Dim / cfg.Heads
	qkv := (cfg.Heads + 2*cfg.KVHeads) * hd
	type shape struct {
		name    string
		m, k, n int
	}
	var shapes []shape
	for _, m := range []int{1536, 256, 16, 1} {
		shapes = append(shapes,
			shape{fmt.Sprintf("qkv_m%d", m), m, cfg.Dim, qkv},
			shape{fmt.Sprintf("gateup_m%d", m), m, cfg.Dim, 2 * cfg.FFNDim},
			shape{fmt.Sprintf("down_m%d", m), m, cfg.FFNDim, cfg.Dim},
		)
	}
	threads := cfg.Threads
	for _, level := range []simd.Level{simd.Current(), simd.Generic} {
		prefix := "simd/"
		if level == simd.Generic {
			prefix = "go/"
		}
		for _, s := range shapes {
			if level == simd.Generic && s.m == 256 {
				continue
			}
			b.Run(prefix+s.name, func(b *testing.B) {
				prev, err := simd.SetLevel(level)
				if err != nil {
					b.Fatal(err)
				}
				defer simd.SetLevel(prev)
				a := randMat(1, s.m*s.k)
				w := randMat(2, s.k*s.n) // [k × n]
				pw := weight(w, simd.PackB(s.k, s.n, w, s.n, false), s.k, s.n)
				c := make([]float32, s.m*s.n)
				b.ReportAllocs()
				cpu0 := cpuTime()
				for b.Loop() {
					gemm(newTeam(threads), dense(c, s.m, s.n), dense(a, s.m, s.k), pw, false, false)
				}
				reportFLOPs(b, 2*float64(s.m)*float64(s.k)*float64(s.n), peak, cpu0)
			})
		}
	}
}

// prev12 is the default configuration before the SIMD kernels (12
// layers, width 128, 4/2 heads, SwiGLU 320): BenchmarkPrefill1536/prev12
// compares prefill speed with the gonum-based forward at equal model size.
var prev12 = Config{Layers: 12, Dim: 128, Heads: 4, KVHeads: 2, FFNDim: 320}

// benchPrefill runs full prefills of an n-token prompt with cfg and
// reports CPU and wall time per prefill and tokens per second (wall, all
// threads) and per CPU-second.
func benchPrefill(b *testing.B, cfg Config, n int) {
	m := newModel(b, cfg)
	kv := newKV(b, m, blocksFor(n))
	toks := randTokens(1, n)
	bt := table(0, blocksFor(n))
	b.ReportAllocs()
	cpu0 := cpuTime()
	for b.Loop() {
		if _, err := m.Prefill(kv, PrefillInput{Tokens: toks, BlockTable: bt}); err != nil {
			b.Fatal(err)
		}
	}
	cpu := cpuTime() - cpu0
	b.ReportMetric(float64(cpu.Milliseconds())/float64(b.N), "cpu_ms/prefill")
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/prefill")
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "tokens/s")
	b.ReportMetric(float64(n*b.N)/cpu.Seconds(), "tokens/cpu-s")
}

// BenchmarkPrefill1536 is a full prefill of a 1,536-token prompt with the
// default configuration and with prev12, the previous default.
func BenchmarkPrefill1536(b *testing.B) {
	b.Run("default", func(b *testing.B) { benchPrefill(b, Config{}, 1536) })
	b.Run("prev12", func(b *testing.B) { benchPrefill(b, prev12, 1536) })
}

// BenchmarkPrefill2000 is a full prefill of a 2,000-token prompt with the
// default configuration (the size the defaults are chosen for).
func BenchmarkPrefill2000(b *testing.B) { benchPrefill(b, Config{}, 2000) }

// BenchmarkBlendRAG compares the TTFT forward of a RAG prompt (6 reused
// 256-token documents at new positions + a 64-token question) with
// CacheBlend reuse at the default ratio against a full prefill of the same
// prompt, and reports the speed-up next to its ceiling
// L/(cl+1+(L-cl-1)·ratio), the CPU time of each, and the wall time of the
// blend's three phases in its last iteration (full_recomp_ms, check_ms,
// partial_ms).
func BenchmarkBlendRAG(b *testing.B) {
	m := newModel(b, Config{})
	const docLen, nDocs, qLen = 256, 6, 64
	total := nDocs*docLen + qLen
	promptBlocks := blocksFor(total)
	docBlocks := blocksFor(docLen)
	kv := newKV(b, m, promptBlocks+nDocs*docBlocks)
	bt := table(0, promptBlocks)
	var toks []int32
	var ranges []reuseplan.Range
	for d := range nDocs {
		doc := randTokens(uint64(100+d), docLen)
		// Store: the document prefilled alone at positions 0...
		store := table(promptBlocks+d*docBlocks, docBlocks)
		if _, err := m.Prefill(kv, PrefillInput{Tokens: doc, BlockTable: store}); err != nil {
			b.Fatal(err)
		}
		ranges = append(ranges, reuseplan.Range{Start: len(toks), End: len(toks) + docLen})
		toks = append(toks, doc...)
	}
	toks = append(toks, randTokens(999, qLen)...)
	scatter := func() {
		for d, r := range ranges {
			copyKV(m, kv, table(promptBlocks+d*docBlocks, docBlocks), 0, bt, r.Start, docLen)
		}
	}
	in := BlendInput{Tokens: toks, BlockTable: bt, Reused: ranges, CheckLayer: UseConfig, RecompRatio: UseConfig}

	var blendTime, fullTime, blendCPU, fullCPU time.Duration
	var st BlendStats
	var dev float64
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		scatter() // the blend server's retrieve, not part of the forward
		b.StartTimer()
		t0, c0 := time.Now(), cpuTime()
		blended, s, err := m.BlendForward(kv, in)
		if err != nil {
			b.Fatal(err)
		}
		st = s
		blendTime += time.Since(t0)
		blendCPU += cpuTime() - c0
		t0, c0 = time.Now(), cpuTime()
		full, err := m.Prefill(kv, PrefillInput{Tokens: toks, BlockTable: bt})
		if err != nil {
			b.Fatal(err)
		}
		fullTime += time.Since(t0)
		fullCPU += cpuTime() - c0
		dev = maxAbsDiff(blended, full)
	}
	cfg := m.Config()
	b.ReportMetric(float64(blendTime.Milliseconds())/float64(b.N), "blend_ms")
	b.ReportMetric(float64(fullTime.Milliseconds())/float64(b.N), "full_ms")
	b.ReportMetric(float64(fullTime)/float64(blendTime), "speedup")
	b.ReportMetric(float64(fullCPU)/float64(blendCPU), "cpu_speedup")
	b.ReportMetric(cfg.SpeedupCeiling(), "ceiling")
	b.ReportMetric(float64(st.ImpCount), "imp_count")
	b.ReportMetric(float64(blendCPU.Microseconds())/1000/float64(b.N), "blend_cpu_ms")
	b.ReportMetric(float64(fullCPU.Microseconds())/1000/float64(b.N), "full_cpu_ms")
	b.ReportMetric(float64(st.FullRecompEnd.Sub(st.FullRecompStart).Microseconds())/1000, "full_recomp_ms")
	b.ReportMetric(float64(st.CheckEnd.Sub(st.CheckStart).Microseconds())/1000, "check_ms")
	b.ReportMetric(float64(st.PartialEnd.Sub(st.PartialStart).Microseconds())/1000, "partial_ms")
	b.ReportMetric(dev, "max_logit_dev")
}

// BenchmarkDecode is one decode step at batch 1 and 16, each sequence with a
// 1,024-token context.
func BenchmarkDecode(b *testing.B) {
	for _, bs := range []int{1, 16} {
		b.Run(fmt.Sprintf("batch%d", bs), func(b *testing.B) {
			m := newModel(b, Config{})
			const ctx = 1024
			per := blocksFor(ctx + 1)
			kv := newKV(b, m, bs*per)
			in := make([]DecodeInput, bs)
			first := table(0, per)
			if _, err := m.Prefill(kv, PrefillInput{Tokens: randTokens(1, ctx), BlockTable: first}); err != nil {
				b.Fatal(err)
			}
			for i := range in {
				bt := table(i*per, per)
				if i > 0 { // same context for every sequence: copy the K/V
					copyKV(m, kv, first, 0, bt, 0, ctx)
				}
				in[i] = DecodeInput{Token: int32('a' + i), Pos: ctx, BlockTable: bt}
			}
			b.ReportAllocs()
			cpu0 := cpuTime()
			for b.Loop() {
				if _, err := m.Decode(kv, in); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/1e3/float64(b.N), "cpu_ms/step")
			b.ReportMetric(float64(bs*b.N)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}

// BenchmarkAttention2048 is the attention of one layer of a full prefill of
// a 2,048-token prompt with the default configuration, as the forward runs
// it (K/V gathered from the cache, then the fused flash kernel per tile of
// query rows and head, on the model's threads). FLOPs count the causal
// work only: 4·HeadDim per (query head, row, attended position).
func BenchmarkAttention2048(b *testing.B) {
	peak := measurePeak()
	m := newModel(b, Config{})
	const n = 2048
	kv := newKV(b, m, blocksFor(n))
	ws := m.getWS()
	defer m.putWS(ws)
	bat := prefixBatch(b, kv, n)
	pos := bat.pos
	qkv := dense(randMat(5, n*m.qkvDim), n, m.qkvDim)
	m.ropeAndStore(kv, 0, qkv, bat, true)
	att := dense(make([]float32, n*m.qDim), n, m.qDim)
	var keys float64
	for _, p := range pos {
		keys += float64(p + 1)
	}
	flops := 4 * float64(m.headDim) * keys * float64(m.cfg.Heads)
	b.ReportAllocs()
	cpu0 := cpuTime()
	for b.Loop() {
		m.attention(ws, kv, 0, att, qkv, bat)
	}
	reportFLOPs(b, flops, peak, cpu0)
}

// BenchmarkDecodeAttention is the attention of one decode row in every
// layer of a SmolLM2-135M-shaped model (30 layers, 9 query heads over 3 KV
// heads of 64) over an F16 cache of ctx positions, as a step runs it; its
// figure is the K and V bytes read per second (timed around the attention
// alone). At 4,096 positions the layers' K and V (94 MB) come from memory,
// not the caches; "ctx512cold" reads 64 MiB of other memory before each
// pass, so that the 512 positions' K and V (11.8 MB, which the warm case
// finds in L3) come from memory too, as in a real step, where the weights
// read since the layer's previous step have evicted them.
func BenchmarkDecodeAttention(b *testing.B) {
	for _, tc := range []struct {
		ctx  int
		cold bool
	}{{512, false}, {512, true}, {4096, false}} {
		ctx := tc.ctx
		name := fmt.Sprintf("ctx%d", ctx)
		if tc.cold {
			name += "cold"
		}
		b.Run(name, func(b *testing.B) {
			m := newModel(b, Config{Layers: 30, Dim: 576, Heads: 9, KVHeads: 3, FFNDim: 64, MaxPositions: 8192})
			n := ctx + 1
			kv := newKVOf(b, m, blocksFor(n), kvcache.F16)
			all := prefixBatch(b, kv, n)
			pos, slots := all.pos, all.slot
			qkv := dense(randMat(5, n*m.qkvDim), n, m.qkvDim)
			for l := range m.cfg.Layers {
				m.ropeAndStore(kv, l, qkv, all, false)
			}
			// The decode row: the last position, attending over all n.
			row := dense(qkv.data[ctx*m.qkvDim:], 1, m.qkvDim)
			one := &batch{pos: pos[ctx:], slot: slots[ctx:], seqs: []seqInfo{{r0: 0, r1: 1, ctx: n, slots: slots}}}
			att := dense(make([]float32, m.qDim), 1, m.qDim)
			ws := m.getWS()
			defer m.putWS(ws)
			bytes := float64(2 * m.cfg.Layers * n * m.kvDim * 2)
			var evict []int64
			if tc.cold {
				evict = make([]int64, 64<<20/8)
			}
			var spent time.Duration
			var sink int64
			b.ReportAllocs()
			for b.Loop() {
				for _, v := range evict {
					sink += v
				}
				t0 := time.Now()
				for l := range m.cfg.Layers {
					m.attention(ws, kv, l, att, row, one)
				}
				spent += time.Since(t0)
			}
			evictSink = sink // the reads are used: not removed as dead code
			b.ReportMetric(bytes*float64(b.N)/spent.Seconds()/1e9, "GB/s")
		})
	}
}

// evictSink keeps BenchmarkDecodeAttention's eviction reads alive.
var evictSink int64

// prefixBatch is a batch of one sequence of n rows at positions [0, n),
// in the slots of blocks [0, blocksFor(n)) of kv.
func prefixBatch(tb testing.TB, kv *kvcache.Memory, n int) *batch {
	tb.Helper()
	slots := make([]int, n)
	if err := mapSlots(slots, table(0, blocksFor(n)), kv.Layout()); err != nil {
		tb.Fatal(err)
	}
	pos := make([]int, n)
	for i := range pos {
		pos[i] = i
	}
	return &batch{pos: pos, slot: slots, seqs: []seqInfo{{r0: 0, r1: n, ctx: n, slots: slots}}}
}
