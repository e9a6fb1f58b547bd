package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/component"
	"github.com/cacheblend/cacheblend/loadgen"
	"github.com/cacheblend/cacheblend/stack"
	"github.com/cacheblend/cacheblend/tracestore"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat
// (100 on every Linux architecture Go supports).
const clockTicks = 100

// tinyModel is the worker's model in the CPU-per-request benchmark: 2 layers
// of width 64, so the model's compute does not hide the serving overhead.
var tinyModel = []string{"--layers=2", "--dim=64", "--heads=4", "--kv-heads=2", "--ffn-dim=128"}

// idleWindow is how long BenchmarkRequestCPU watches the stack idle, between
// the warm-up and the run: the CPU a process spends without requests (timers,
// polls) is reported per second.
const idleWindow = 3 * time.Second

// procCPU returns the user+system CPU time a process has used so far, from
// /proc/<pid>/stat (fields 14 and 15, after the parenthesised command name).
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("cpu of pid %d: %w", pid, err)
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("cpu of pid %d: malformed stat %q", pid, s)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); utime is field 14, stime field 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("cpu of pid %d: short stat %q", pid, s)
	}
	var ticks int64
	for _, k := range []int{11, 12} {
		v, err := strconv.ParseInt(f[k], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("cpu of pid %d: field %d: %w", pid, k+3, err)
		}
		ticks += v
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// cpuSample is the CPU time a process used so far, and its pid (a restart
// between two samples would make their difference meaningless).
type cpuSample struct {
	pid int
	cpu time.Duration
}

// stackCPU samples every process of st, by service name.
func stackCPU(st *stack.Stack) (map[string]cpuSample, error) {
	out := map[string]cpuSample{}
	for _, p := range st.Supervisor().Status() {
		d, err := procCPU(p.PID)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p.Name, err)
		}
		out[p.Name] = cpuSample{pid: p.PID, cpu: d}
	}
	return out, nil
}

// BenchmarkRequestCPU measures the CPU time each process of a real stack (the
// cb binary: engine, worker, blend server, tracing on into the embedded
// collector of this test process) spends per request, under a closed-loop
// load of b.N RAG requests (3 sample documents at random offsets, 2 output
// tokens, concurrency 8, reuse on) against a tiny model. CPU is utime+stime from
// /proc/<pid>/stat before and after the run, after a warm-up of 20 requests.
// Run it with a fixed request count:
//
//	go test ./e2e -run '^$' -bench RequestCPU -benchtime 150x
//
// CB_CPUPROFILE=<dir> makes every process write a CPU profile there on exit.
func BenchmarkRequestCPU(b *testing.B) {
	col, err := tracestore.New(tracestore.Config{OTLPAddr: "127.0.0.1:0", QueryAddr: "127.0.0.1:0"}, component.Deps{})
	if err != nil {
		b.Fatal(err)
	}
	if err := col.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	logs := &syncWriter{}
	env := []string{"OTEL_BSP_SCHEDULE_DELAY=100"}
	if dir := os.Getenv("CB_CPUPROFILE"); dir != "" {
		env = append(env, "CB_CPUPROFILE="+dir)
	}
	st, err := stack.Up(context.Background(), stack.UpConfig{
		Exe:          cbBin,
		APIAddr:      "127.0.0.1:0",
		OTLPEndpoint: "http://" + col.OTLPAddr() + "/v1/traces",
		OTLPProtocol: "http/protobuf",
		WorkerArgs:   tinyModel,
		Env:          env,
		Supervisor:   stack.Config{Logs: logs, ReadyTimeout: 90 * time.Second},
	})
	if err != nil {
		col.Shutdown(context.Background())
		b.Fatalf("stack up: %v\nlogs:\n%s", err, logs.String())
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := st.Shutdown(ctx); err != nil {
			b.Errorf("stack shutdown: %v", err)
		}
		col.Shutdown(ctx)
		if b.Failed() {
			b.Logf("process logs:\n%s", tail(logs.String(), 80))
		}
	})
	run := func(n int, ingest bool, seed uint64) {
		b.Helper()
		rep, err := loadgen.Run(context.Background(), loadgen.Config{
			API: st.Endpoints().Engine.API, Requests: n, Concurrency: 8, MaxTokens: 2,
			DocsPerRequest: 3, Ingest: ingest, Seed: seed, SkipServerCheck: true,
			Duration: 10 * time.Minute,
		})
		if err == nil && rep != nil {
			err = rep.Err()
		}
		if err != nil {
			b.Fatalf("load: %v\nlogs:\n%s", err, tail(logs.String(), 40))
		}
		if rep.Succeeded != n {
			b.Fatalf("load: %d of %d requests succeeded", rep.Succeeded, n)
		}
	}
	run(20, true, 7)
	time.Sleep(300 * time.Millisecond) // the warm-up's spans exported
	idle0, err := stackCPU(st)
	if err != nil {
		b.Fatal(err)
	}
	time.Sleep(idleWindow)
	before, err := stackCPU(st)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	run(b.N, false, 1)
	time.Sleep(300 * time.Millisecond) // the run's spans exported (batch delay 100 ms)
	b.StopTimer()
	after, err := stackCPU(st)
	if err != nil {
		b.Fatal(err)
	}
	for _, p := range []struct{ name, unit string }{
		{"cb-engine", "engine-cpu-ms/req"},
		{"cb-blend", "blend-cpu-ms/req"},
		{"cb-worker", "worker-cpu-ms/req"},
	} {
		a, ok := after[p.name]
		if !ok {
			b.Fatalf("no process %s in the stack", p.name)
		}
		if a.pid != before[p.name].pid || a.pid != idle0[p.name].pid {
			b.Fatalf("%s restarted during the run", p.name)
		}
		b.ReportMetric(float64(a.cpu-before[p.name].cpu)/float64(time.Millisecond)/float64(b.N), p.unit)
		b.ReportMetric(float64(before[p.name].cpu-idle0[p.name].cpu)/float64(time.Millisecond)/idleWindow.Seconds(), strings.Replace(p.unit, "/req", "/idle-s", 1))
	}
}
