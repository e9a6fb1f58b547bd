package model

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/kvcache"
	"github.com/cacheblend/cacheblend/tp"
)

// benchRankEnv makes the test binary a rank of BenchmarkTensorParallelPrefill.
const benchRankEnv = "CB_MODEL_BENCH_RANK"

// benchPrefillTokens is the prompt of the tensor-parallel benchmark.
const benchPrefillTokens = 1536

// timedReducer measures the time spent in AllReduce (barrier waits
// included: a rank that waits for a slower peer counts it as all-reduce).
type timedReducer struct {
	tp.AllReducer
	spent time.Duration
}

func (t *timedReducer) AllReduce(buf []float32) error {
	t0 := time.Now()
	err := t.AllReducer.AllReduce(buf)
	t.spent += time.Since(t0)
	return err
}

// benchRank runs one rank of the benchmark: descriptor 3 is the segment
// (world > 1). It reads a count n per line on stdin, runs n prefills of the
// default model and answers "wall_ns cpu_ns allreduce_ns".
func benchRank() int {
	rank, _ := strconv.Atoi(os.Getenv(benchRankEnv))
	world, _ := strconv.Atoi(os.Getenv("CB_MODEL_BENCH_WORLD"))
	var m *Model
	var tr *timedReducer
	var err error
	if world <= 1 {
		m, err = New(Config{})
	} else {
		f := os.NewFile(3, "segment")
		r, oerr := tp.OpenSegment(f, rank, tp.Config{})
		f.Close()
		if oerr != nil {
			fmt.Fprintln(os.Stderr, oerr)
			return 2
		}
		defer r.Close()
		tr = &timedReducer{AllReducer: r}
		m, err = NewShard(Config{}, tr)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	nb := (benchPrefillTokens + testBlock - 1) / testBlock
	kv, err := kvcache.Create("", m.KVLayout(nb, testBlock, kvcache.F32))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer kv.Close()
	in := PrefillInput{Tokens: randTokens(3, benchPrefillTokens), BlockTable: table(0, nb)}
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		n, _ := strconv.Atoi(sc.Text())
		if tr != nil {
			tr.spent = 0
		}
		c0, t0 := cpuTime(), time.Now()
		for range n {
			if _, err := m.Prefill(kv, in); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 3
			}
		}
		wall, cpu := time.Since(t0), cpuTime()-c0
		var ar time.Duration
		if tr != nil {
			ar = tr.spent
		}
		fmt.Printf("%d %d %d\n", wall, cpu, ar)
	}
	return 0
}

type benchProc struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

// BenchmarkTensorParallelPrefill is the prefill of a 1,536-token prompt on
// the default model by a group of rank processes, each with GOMAXPROCS=1
// (one core per rank), all-reducing over a shared memfd segment: tp1 is
// the whole model in one process, tp2 two ranks. It reports the wall time
// per prefill, the CPU time of all ranks per prefill and the share of the
// ranks' layer time spent in the all-reduce (barrier waits included), and
// the busiest rank's CPU time per prefill.
func BenchmarkTensorParallelPrefill(b *testing.B) {
	for _, world := range []int{1, 2} {
		b.Run(fmt.Sprintf("tp%d", world), func(b *testing.B) {
			b.ReportAllocs()
			var seg *os.File
			if world > 1 {
				var err error
				if seg, err = tp.CreateSegment(world, tp.Config{}); err != nil {
					b.Fatal(err)
				}
				defer seg.Close()
			}
			procs := make([]*benchProc, world)
			for rank := range world {
				cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.bench=^$")
				cmd.Env = append(os.Environ(), "GOMAXPROCS=1", benchRankEnv+"="+strconv.Itoa(rank), "CB_MODEL_BENCH_WORLD="+strconv.Itoa(world))
				if seg != nil {
					cmd.ExtraFiles = []*os.File{seg}
				}
				cmd.Stderr = os.Stderr
				in, err := cmd.StdinPipe()
				if err != nil {
					b.Fatal(err)
				}
				out, err := cmd.StdoutPipe()
				if err != nil {
					b.Fatal(err)
				}
				if err := cmd.Start(); err != nil {
					b.Fatal(err)
				}
				procs[rank] = &benchProc{cmd: cmd, in: in, out: bufio.NewScanner(out)}
			}
			defer func() {
				for _, p := range procs {
					p.in.Close()
					p.cmd.Wait()
				}
			}()
			run := func(n int) (wall, cpu, ar, rankCPU time.Duration) {
				for _, p := range procs {
					fmt.Fprintf(p.in, "%d\n", n)
				}
				for _, p := range procs {
					if !p.out.Scan() {
						b.Fatalf("rank exited: %v", p.out.Err())
					}
					f := strings.Fields(p.out.Text())
					w, _ := strconv.ParseInt(f[0], 10, 64)
					c, _ := strconv.ParseInt(f[1], 10, 64)
					a, _ := strconv.ParseInt(f[2], 10, 64)
					wall = max(wall, time.Duration(w))
					cpu += time.Duration(c)
					rankCPU = max(rankCPU, time.Duration(c))
					ar += time.Duration(a)
				}
				return wall, cpu, ar, rankCPU
			}
			run(1) // warm up: weights built, pages touched
			b.ResetTimer()
			wall, cpu, ar, rankCPU := run(b.N)
			b.StopTimer()
			n := float64(b.N)
			b.ReportMetric(float64(wall.Milliseconds())/n, "ms/prefill")
			b.ReportMetric(cpu.Seconds()/n, "cpu-s/prefill")
			// The busiest rank's CPU time: the wall time per prefill when
			// every rank has a core of its own (a loaded machine inflates
			// the wall time, not this).
			b.ReportMetric(rankCPU.Seconds()/n, "rank-cpu-s/prefill")
			b.ReportMetric(100*ar.Seconds()/(float64(world)*wall.Seconds()), "allreduce-%")
		})
	}
}
