package idle

import (
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestWatch(t *testing.T) {
	for _, tc := range []struct {
		name    string
		touches int // bytes arriving every 20 ms
		wantCut bool
	}{
		{"silent from the start: cut", 0, true},
		{"bytes keep coming: not cut while they do", 10, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var a Activity
			var cut atomic.Int32
			stop := Watch(60*time.Millisecond, &a, func() { cut.Add(1) })
			for range tc.touches {
				time.Sleep(20 * time.Millisecond)
				a.Touch()
			}
			if tc.touches == 0 {
				time.Sleep(150 * time.Millisecond)
			}
			stop()
			if got := cut.Load() > 0; got != tc.wantCut {
				t.Fatalf("cut %v, want %v", got, tc.wantCut)
			}
			if cut.Load() > 1 {
				t.Fatalf("cut %d times", cut.Load())
			}
		})
	}
}

func TestBodyTouches(t *testing.T) {
	var a Activity
	if !a.Stalled(time.Now(), time.Hour) {
		t.Fatal("no byte yet, not stalled")
	}
	b := Body(io.NopCloser(strings.NewReader("abc")), &a)
	if _, err := io.ReadAll(b); err != nil {
		t.Fatal(err)
	}
	if _, ok := a.Last(); !ok || a.Stalled(time.Now(), time.Minute) {
		t.Fatal("a read with bytes was not recorded")
	}
	if !a.Stalled(time.Now().Add(2*time.Minute), time.Minute) {
		t.Fatal("two minutes later it is stalled")
	}
}
