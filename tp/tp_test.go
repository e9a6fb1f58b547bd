package tp

import (
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"
)

// runGroup runs fn on every rank of a local group concurrently.
func runGroup(t *testing.T, rs []*Reducer, fn func(r *Reducer) error) []error {
	t.Helper()
	errs := make([]error, len(rs))
	var wg sync.WaitGroup
	for i, r := range rs {
		wg.Go(func() { errs[i] = fn(r) })
	}
	wg.Wait()
	return errs
}

func vec(rank, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(math.Sin(float64(rank*7919+i))) * 1e3
	}
	return v
}

func TestAllReduceSums(t *testing.T) {
	cases := []struct {
		name           string
		world, n, slot int
		rounds         int
	}{
		{"one rank", 1, 100, 16, 3},
		{"two ranks, one slot", 2, 10, 16, 5},
		{"two ranks, several slots", 2, 100, 16, 4},
		{"three ranks, exact slots", 3, 48, 16, 4},
		{"four ranks, empty vector", 4, 0, 16, 2},
		{"two ranks, default slot", 2, 5000, 0, 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rs, err := NewLocalGroup(c.world, Config{SlotFloats: c.slot, Timeout: 10 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			outs := make([][][]float32, c.world)
			errs := runGroup(t, rs, func(r *Reducer) error {
				for k := range c.rounds {
					v := vec(r.Rank()+k, c.n)
					if err := r.AllReduce(v); err != nil {
						return err
					}
					outs[r.Rank()] = append(outs[r.Rank()], v)
				}
				return nil
			})
			for i, err := range errs {
				if err != nil {
					t.Fatalf("rank %d: %v", i, err)
				}
			}
			for k := range c.rounds {
				want := vec(k, c.n)
				for q := 1; q < c.world; q++ {
					addTo(want, vec(q+k, c.n))
				}
				for rank := range c.world {
					got := outs[rank][k]
					for i := range want {
						if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
							t.Fatalf("round %d rank %d [%d] = %v, want %v (bit-identical)", k, rank, i, got[i], want[i])
						}
					}
				}
			}
		})
	}
}

func TestAllReduceFailures(t *testing.T) {
	cases := []struct {
		name string
		// act runs on rank 1 instead of its AllReduce.
		act  func(r *Reducer) error
		want error
	}{
		{"peer aborts", func(r *Reducer) error { r.Abort(); return ErrAborted }, ErrAborted},
		{"peer marked dead", func(r *Reducer) error { r.PeerDied(); return ErrPeerDead }, ErrPeerDead},
		{"peer never arrives", func(*Reducer) error { return nil }, ErrTimeout},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rs, err := NewLocalGroup(2, Config{SlotFloats: 8, Timeout: 50 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			errs := runGroup(t, rs, func(r *Reducer) error {
				if r.Rank() == 1 {
					return c.act(r)
				}
				return r.AllReduce(make([]float32, 4))
			})
			if !errors.Is(errs[0], c.want) {
				t.Fatalf("rank 0: %v, want %v", errs[0], c.want)
			}
			// Sticky: the next call fails without waiting.
			if err := rs[0].AllReduce(make([]float32, 4)); !errors.Is(err, c.want) {
				t.Fatalf("second call: %v, want %v", err, c.want)
			}
		})
	}
}

func TestBadSegments(t *testing.T) {
	cases := []struct {
		name string
		open func() error
	}{
		{"world 0", func() error { _, err := NewLocalGroup(0, Config{}); return err }},
		{"world too large", func() error { _, err := CreateSegment(MaxWorld+1, Config{}); return err }},
		{"rank outside", func() error {
			f, err := CreateSegment(2, Config{SlotFloats: 8})
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = OpenSegment(f, 2, Config{})
			return err
		}},
		{"not a segment", func() error {
			f, err := os.CreateTemp(t.TempDir(), "seg")
			if err != nil {
				return err
			}
			defer f.Close()
			if err := f.Truncate(8192); err != nil {
				return err
			}
			_, err = OpenSegment(f, 0, Config{})
			return err
		}},
		{"too small", func() error {
			f, err := os.CreateTemp(t.TempDir(), "seg")
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = OpenSegment(f, 0, Config{})
			return err
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := c.open(); !errors.Is(err, ErrBadSegment) {
				t.Fatalf("got %v, want ErrBadSegment", err)
			}
		})
	}
}

const childEnv = "CB_TP_TEST_CHILD"

// runChild is rank 1 of TestProcessGroup: the segment is descriptor 3.
// Mode "sum" reduces rounds and exits; mode "die" reduces once, then exits
// in the middle of the group's second round.
func runChild() int {
	f := os.NewFile(3, "segment")
	r, err := OpenSegment(f, 1, Config{Timeout: 30 * time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	f.Close()
	n, _ := strconv.Atoi(os.Getenv("CB_TP_TEST_N"))
	rounds := 3
	if os.Getenv(childEnv) == "die" {
		rounds = 1
	}
	for k := range rounds {
		if err := r.AllReduce(vec(1+k, n)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 3
		}
	}
	return 0
}

func TestProcessGroup(t *testing.T) {
	cases := []struct {
		name    string
		mode    string
		wantErr error // of rank 0's second round
	}{
		{"two processes sum", "sum", nil},
		{"peer process dies", "die", ErrPeerDead},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			const n = 3000
			seg, err := CreateSegment(2, Config{SlotFloats: 1024})
			if err != nil {
				t.Fatal(err)
			}
			defer seg.Close()
			r, err := OpenSegment(seg, 0, Config{Timeout: 30 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), childEnv+"="+c.mode, "CB_TP_TEST_N="+strconv.Itoa(n))
			cmd.ExtraFiles = []*os.File{seg}
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			// The child records its pid when it maps the segment: until
			// then rank 0 knows it by the process it started.
			r.WatchPeer(1, cmd.Process.Pid)
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }() // reaps the child, so a dead pid is gone
			var got error
			for k := range 3 {
				v := vec(k, n)
				if got = r.AllReduce(v); got != nil {
					break
				}
				want := vec(k, n)
				addTo(want, vec(1+k, n))
				for i := range want {
					if v[i] != want[i] {
						t.Fatalf("round %d [%d] = %v, want %v", k, i, v[i], want[i])
					}
				}
			}
			if !errors.Is(got, c.wantErr) {
				t.Fatalf("rank 0: %v, want %v", got, c.wantErr)
			}
			if err := <-exited; err != nil && c.wantErr == nil {
				t.Fatalf("child: %v", err)
			}
		})
	}
}
