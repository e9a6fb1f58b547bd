package model

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/simd"
)

// naive computes c = a·b (b [k×n]) in float64.
func naive(a []float32, b []float32, m, k, n int) []float64 {
	c := make([]float64, m*n)
	for i := range m {
		for j := range n {
			var s float64
			for p := range k {
				s += float64(a[i*k+p]) * float64(b[p*n+j])
			}
			c[i*n+j] = s
		}
	}
	return c
}

func TestGemmTiles(t *testing.T) {
	tests := []struct {
		name    string
		m, k, n int
	}{
		{"1x1x1", 1, 1, 1},
		{"row", 1, 64, 200},
		{"odd", 3, 5, 7},
		{"tile_edges", 97, 33, 130},
		{"two_row_tiles", 193, 64, 197},
		{"k0", 7, 0, 5},
	}
	for _, tc := range tests {
		m, k, n := tc.m, tc.k, tc.n
		t.Run(tc.name, func(t *testing.T) {
			a, b := randMat(1, m*k), randMat(2, k*n)
			bt := make([]float32, n*k)
			for i := range k {
				for j := range n {
					bt[j*k+i] = b[i*n+j]
				}
			}
			want := naive(a, b, m, k, n)
			check := func(name string, c []float32, factor float64) {
				t.Helper()
				for i := range c {
					if d := math.Abs(float64(c[i]) - factor*want[i]); d > 1e-3*(1+math.Abs(factor*want[i])) {
						t.Fatalf("%s: element %d = %g, want %g", name, i, c[i], factor*want[i])
					}
				}
			}
			pb := simd.PackB(k, n, b, n, false)
			pbt := simd.PackB(k, n, bt, k, true)
			for _, threads := range []int{1, 2, 3} {
				c := make([]float32, m*n)
				gemm(newTeam(threads), dense(c, m, n), dense(a, m, k), dense(b, k, n), false, false)
				check("gemm", c, 1)
				gemm(newTeam(threads), dense(c, m, n), dense(a, m, k), dense(b, k, n), false, true)
				check("gemm acc", c, 2)
				clear(c)
				gemm(newTeam(threads), dense(c, m, n), dense(a, m, k), dense(bt, n, k), true, false)
				check("gemm transB", c, 1)
				clear(c)
				gemm(newTeam(threads), dense(c, m, n), dense(a, m, k), weight(b, pb, k, n), false, false)
				check("gemm packed", c, 1)
				gemm(newTeam(threads), dense(c, m, n), dense(a, m, k), weightT(bt, pbt, n, k), true, true)
				check("gemm packed transB acc", c, 2)
				if n > 32 {
					// A column view starting on a panel keeps the packed form.
					clear(c)
					w := weight(b, pb, k, n).view(0, 32, k, n-32)
					if w.pk == nil || w.pkOff != 32 {
						t.Fatalf("view dropped the packed form: %+v", w.pkOff)
					}
					gemm(newTeam(threads), dense(c, m, n).view(0, 32, m, n-32), dense(a, m, k), w, false, false)
					for i := range m {
						for j := 32; j < n; j++ {
							if d := math.Abs(float64(c[i*n+j]) - want[i*n+j]); d > 1e-3*(1+math.Abs(want[i*n+j])) {
								t.Fatalf("packed view: c[%d,%d] = %g, want %g", i, j, c[i*n+j], want[i*n+j])
							}
						}
					}
				}
			}
		})
	}
}

func TestParallelRunsEveryTaskOnce(t *testing.T) {
	for _, threads := range []int{1, 2, 8} {
		for _, n := range []int{0, 1, 5, 100} {
			hits := make([]atomic.Int32, n)
			var maxWorker atomic.Int32
			parallel(threads, n, func(w, i int) {
				hits[i].Add(1)
				if int32(w) > maxWorker.Load() {
					maxWorker.Store(int32(w))
				}
			})
			for i := range hits {
				if hits[i].Load() != 1 {
					t.Fatalf("threads %d n %d: task %d ran %d times", threads, n, i, hits[i].Load())
				}
			}
			if int(maxWorker.Load()) >= max(1, threads) {
				t.Fatalf("worker index %d with %d threads", maxWorker.Load(), threads)
			}
		}
	}
}

func TestSoftmaxPrefix(t *testing.T) {
	row := []float32{0, -1, -3, 2, 99}
	inv := softmaxPrefix(row, 4, 1)
	sum := 0.0
	for i := range 4 {
		want := math.Exp(float64([]float32{0, -1, -3, 2}[i]) - 2)
		if math.Abs(float64(row[i])-want) > 1e-5*want {
			t.Fatalf("softmax numerator %d = %g, want %g", i, row[i], want)
		}
		sum += float64(row[i])
	}
	if row[4] != 0 || math.Abs(float64(inv)*sum-1) > 1e-5 {
		t.Fatalf("softmax tail %g, inv·sum %g", row[4], float64(inv)*sum)
	}
}

func TestRMSNorm(t *testing.T) {
	x := []float32{3, 4, 0, 0, 1, 2, 3}
	g := []float32{1, 2, 1, 1, 1, 1, 0.5}
	dst := make([]float32, len(x))
	const rmsEps = 1e-6
	(&Model{cfg: Config{NormEps: rmsEps}}).rmsNorm(dst, x, g)
	var ss float64
	for _, v := range x {
		ss += float64(v * v)
	}
	inv := 1 / math.Sqrt(ss/float64(len(x))+rmsEps)
	for i := range x {
		if want := float64(x[i]) * inv * float64(g[i]); math.Abs(float64(dst[i])-want) > 1e-5 {
			t.Fatalf("rmsNorm[%d] = %g, want %g", i, dst[i], want)
		}
	}
}

// TestTeamHelperOutlivesLongTask: a loop whose caller runs a long task
// (5 ms, as a task of a large product) while the helper has none left,
// then the next loop at once: the helper waits for the first loop's end
// before its idle time counts, so the second loop finds it and starts no
// other (a helper counting from its own last task exited during the long
// one, and every loop of a decode step paid for a new goroutine). Five
// attempts, so that the caller descheduled for a whole teamSpin between the
// loops on a loaded machine does not fail it; a helper that exits during
// the long task fails all five.
func TestTeamHelperOutlivesLongTask(t *testing.T) {
	var starts []int64
	for range 5 {
		tm := newTeam(2)
		for range 2 {
			tm.run(8, func(w, _ int) {
				if w == 0 {
					time.Sleep(5 * time.Millisecond)
				}
			})
		}
		starts = append(starts, tm.started.Load())
		for tm.alive[1].Load() {
			time.Sleep(time.Millisecond)
		}
		if starts[len(starts)-1] == 1 {
			return
		}
	}
	t.Fatalf("helpers started per two loops: %v, want 1", starts)
}

// TestTeamRunsEveryTaskOnce: loops back to back (helpers reused), loops
// from several goroutines at once (one on the team, the others on their own
// goroutines) and helpers gone once the team is idle.
func TestTeamRunsEveryTaskOnce(t *testing.T) {
	tests := []struct {
		name              string
		threads, n, loops int
		callers           int
	}{
		{"one thread", 1, 50, 3, 1},
		{"two threads, many loops", 2, 37, 200, 1},
		{"fewer tasks than threads", 8, 3, 50, 1},
		{"single task", 4, 1, 10, 1},
		{"concurrent callers", 3, 64, 50, 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tm := newTeam(tc.threads)
			var wg sync.WaitGroup
			for range tc.callers {
				wg.Go(func() {
					for l := range tc.loops {
						hits := make([]atomic.Int32, tc.n)
						var bad atomic.Int32
						tm.run(tc.n, func(w, i int) {
							hits[i].Add(1)
							if w < 0 || w >= tc.threads {
								bad.Store(int32(w) + 1)
							}
						})
						for i := range hits {
							if h := hits[i].Load(); h != 1 {
								t.Errorf("loop %d: task %d ran %d times", l, i, h)
								return
							}
						}
						if b := bad.Load(); b != 0 {
							t.Errorf("loop %d: worker index %d with %d threads", l, b-1, tc.threads)
							return
						}
					}
				})
			}
			wg.Wait()
			deadline := time.Now().Add(5 * time.Second)
			for i := range tm.alive {
				for tm.alive[i].Load() {
					if time.Now().After(deadline) {
						t.Fatalf("helper %d still running long after the last loop", i)
					}
					time.Sleep(time.Millisecond)
				}
			}
		})
	}
}

// TestTeamJobRanges: a loop's tasks are cut into one contiguous range per
// thread, and a range hands its tasks from the front in order and from the
// back in reverse, each once.
func TestTeamJobRanges(t *testing.T) {
	tests := []struct {
		name     string
		n, parts int
		want     [][2]int
	}{
		{"even", 8, 2, [][2]int{{0, 4}, {4, 8}}},
		{"uneven", 10, 3, [][2]int{{0, 4}, {4, 7}, {7, 10}}},
		{"one each", 3, 3, [][2]int{{0, 1}, {1, 2}, {2, 3}}},
		{"beyond inline", 20, 10, [][2]int{{0, 2}, {2, 4}, {4, 6}, {6, 8}, {8, 10}, {10, 12}, {12, 14}, {14, 16}, {16, 18}, {18, 20}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			j := newTeamJob(tc.n, tc.parts, nil)
			if len(j.ranges) != len(tc.want) {
				t.Fatalf("%d ranges, want %d", len(j.ranges), len(tc.want))
			}
			for i, w := range tc.want {
				v := j.ranges[i].lohi.Load()
				if lo, hi := int(uint32(v)), int(v>>32); lo != w[0] || hi != w[1] {
					t.Errorf("range %d = [%d, %d), want [%d, %d)", i, lo, hi, w[0], w[1])
				}
			}
		})
	}
	j := newTeamJob(6, 1, nil)
	var got []int
	for _, front := range []bool{true, false, true, false, true, false, true} {
		if i, ok := j.ranges[0].take(front); ok {
			got = append(got, i)
		}
	}
	if want := []int{0, 5, 1, 4, 2, 3}; !slices.Equal(got, want) {
		t.Errorf("takes front/back alternately = %v, want %v", got, want)
	}
}

// TestTeamThreadsTakeNeighbours: in a loop on two threads, each thread's
// tasks from its own range come in order from the range's start, and the
// tasks it takes from the other's come in reverse from that range's end —
// the order that keeps each thread's reads in one stream — whoever runs
// first (the helper of a fresh team starts late; a reused one does not).
func TestTeamThreadsTakeNeighbours(t *testing.T) {
	const n = 64
	tm := newTeam(2)
	for loop := range 50 {
		var mu sync.Mutex
		seq := make([][]int, 2)
		tm.run(n, func(w, i int) {
			mu.Lock()
			seq[w] = append(seq[w], i)
			mu.Unlock()
		})
		if len(seq[0])+len(seq[1]) != n {
			t.Fatalf("loop %d: %d+%d tasks, want %d", loop, len(seq[0]), len(seq[1]), n)
		}
		for w, s := range seq {
			lo, hi := w*n/2, (w+1)*n/2
			var own, stolen []int
			for _, i := range s {
				if i >= lo && i < hi {
					own = append(own, i)
				} else {
					stolen = append(stolen, i)
				}
			}
			for k, i := range own {
				if i != lo+k {
					t.Fatalf("loop %d: worker %d's own tasks %v, want %d, %d, … in order", loop, w, own, lo, lo+1)
				}
			}
			olo, ohi := (1-w)*n/2, (2-w)*n/2
			for k, i := range stolen {
				if i != ohi-1-k || i < olo {
					t.Fatalf("loop %d: worker %d took %v from the other range, want %d, %d, … in reverse", loop, w, stolen, ohi-1, ohi-2)
				}
			}
		}
	}
}
