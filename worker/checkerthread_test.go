package worker

import (
	"context"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/kvcache"
	"github.com/cacheblend/cacheblend/model"
)

// threadNice reads the calling thread's nice value from
// /proc/thread-self/stat (field 19).
func threadNice(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/thread-self/stat")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:]) // after "pid (comm) "
	n, err := strconv.Atoi(fields[16])                            // field 19 of the whole line
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// lowerThreadPriority lowers the calling thread only: the checker's, not
// the request path's.
func TestLowerThreadPriority(t *testing.T) {
	before := make(chan int)
	after := make(chan int)
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the niced thread ends with the goroutine
		before <- threadNice(t)
		errc <- lowerThreadPriority()
		after <- threadNice(t)
	}()
	b := <-before
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if a := <-after; a != checkerNice {
		t.Fatalf("checker thread nice %d (was %d), want %d", a, b, checkerNice)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if n := threadNice(t); n == checkerNice {
		t.Fatalf("another thread's nice became %d", n)
	}
}

// A worker with the online quality check runs one more Go processor while
// it runs, and gives it back at Shutdown.
func TestCheckerProcessor(t *testing.T) {
	base := runtime.GOMAXPROCS(0)
	h := start(t, Config{Quality: QualityConfig{SampleRate: 0.5}})
	deadline := time.Now().Add(5 * time.Second)
	for runtime.GOMAXPROCS(0) != base+1 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond) // the checker goroutine adds it when it starts
	}
	if n := runtime.GOMAXPROCS(0); n != base+1 {
		t.Fatalf("GOMAXPROCS %d with a checker, want %d", n, base+1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.w.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if n := runtime.GOMAXPROCS(0); n != base {
		t.Fatalf("GOMAXPROCS %d after Shutdown, want %d", n, base)
	}
}

// The checker's memory made ready at start is bounded in bytes as well as
// tokens: the default model gets every token of the bound, a wider one fewer.
func TestReserveFor(t *testing.T) {
	small, err := model.New(smallModel)
	if err != nil {
		t.Fatal(err)
	}
	wide := smallModel
	wide.Layers, wide.Dim, wide.Heads, wide.KVHeads, wide.FFNDim = 16, 1024, 16, 16, 2048
	big, err := model.New(wide)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		m    *model.Model
		dt   kvcache.DType
	}{{"small", small, kvcache.F32}, {"wide", big, kvcache.F32}, {"wide f16", big, kvcache.F16}} {
		t.Run(tc.name, func(t *testing.T) {
			n := reserveFor(tc.m, tc.dt)
			l := tc.m.KVLayout(1, 1, tc.dt)
			bytes := n * 4 * l.NumLayers * l.KVHeads * l.HeadDim * tc.dt.Size() // two copies, K and V
			if n < 1 || n > reserveTokens || n > tc.m.Config().MaxPositions || bytes > reserveBytes {
				t.Fatalf("reserve %d tokens (%d bytes)", n, bytes)
			}
		})
	}
	if reserveFor(big, kvcache.F32) >= reserveFor(small, kvcache.F32) {
		t.Fatalf("a wider model reserves %d tokens, the small one %d", reserveFor(big, kvcache.F32), reserveFor(small, kvcache.F32))
	}
	if reserveFor(big, kvcache.F16) != min(reserveTokens, 2*reserveFor(big, kvcache.F32)) {
		t.Fatalf("an F16 pool reserves %d tokens, an F32 one %d", reserveFor(big, kvcache.F16), reserveFor(big, kvcache.F32))
	}
}
