package offheap

import (
	"sync"
	"testing"
	"unsafe"
)

func TestPool(t *testing.T) {
	same := func(a, b []float32) bool { return unsafe.SliceData(a[:1]) == unsafe.SliceData(b[:1]) }
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, p *Pool)
	}{
		{"a put buffer comes back for a request it holds", func(t *testing.T, p *Pool) {
			a := p.Get(1000)
			if len(a) != 1000 || cap(a) < 1250 {
				t.Fatalf("len %d cap %d, want 1000 and a quarter of headroom", len(a), cap(a))
			}
			a[999] = 7
			p.Put(a)
			b := p.Get(1200)
			if !same(a, b) || len(b) != 1200 {
				t.Fatalf("got a new buffer (len %d) for 1200 floats after putting one of cap %d", len(b), cap(a))
			}
			p.Put(b)
		}},
		{"the smallest free buffer that holds the request", func(t *testing.T, p *Pool) {
			small, big := p.Get(1<<10), p.Get(1<<16)
			p.Put(big)
			p.Put(small)
			if got := p.Get(100); !same(got, small) {
				t.Fatal("a 100-float request took the big buffer")
			}
			if got := p.Get(100); !same(got, big) {
				t.Fatal("the second request did not take the big buffer")
			}
		}},
		{"an outgrown buffer is unmapped, not kept", func(t *testing.T, p *Pool) {
			p.Put(p.Get(1 << 10))
			if p.Len() != 1 {
				t.Fatalf("Len %d after one Put", p.Len())
			}
			b := p.Get(1 << 20)
			if p.Len() != 0 {
				t.Fatalf("Len %d: the outgrown buffer was kept beside the bigger one", p.Len())
			}
			p.Put(b)
		}},
		{"at most Max free buffers", func(t *testing.T, p *Pool) {
			p.Max = 2
			bufs := [][]float32{p.Get(10), p.Get(20), p.Get(30)}
			for _, b := range bufs {
				p.Put(b)
			}
			if p.Len() != 2 {
				t.Fatalf("Len %d, want Max = 2", p.Len())
			}
		}},
		{"DefaultPoolMax when Max is 0", func(t *testing.T, p *Pool) {
			var bufs [][]float32
			for i := range DefaultPoolMax + 3 {
				bufs = append(bufs, p.Get(10+i))
			}
			for _, b := range bufs {
				p.Put(b)
			}
			if p.Len() != DefaultPoolMax {
				t.Fatalf("Len %d, want %d", p.Len(), DefaultPoolMax)
			}
		}},
		{"Drain empties the pool", func(t *testing.T, p *Pool) {
			p.Put(p.Get(10))
			p.Put(p.Get(1 << 16))
			p.Drain()
			if p.Len() != 0 {
				t.Fatalf("Len %d after Drain", p.Len())
			}
		}},
		{"Get(0) and Put(nil)", func(t *testing.T, p *Pool) {
			if b := p.Get(0); len(b) != 0 {
				t.Fatalf("Get(0) has %d floats", len(b))
			}
			p.Put(nil)
			if p.Len() != 0 {
				t.Fatalf("Len %d after Put(nil)", p.Len())
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Pool{}
			defer p.Drain()
			tc.run(t, p)
		})
	}
}

func TestPoolConcurrent(t *testing.T) {
	var p Pool
	defer p.Drain()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				n := 1 + (g*997+i*131)%50000
				b := p.Get(n)
				for j := range b {
					b[j] = float32(g)
				}
				for j := range b {
					if b[j] != float32(g) {
						t.Errorf("goroutine %d: b[%d] = %g: a buffer handed out twice", g, j, b[j])
						return
					}
				}
				p.Put(b)
			}
		}()
	}
	wg.Wait()
	if p.Len() > DefaultPoolMax {
		t.Fatalf("Len %d > %d", p.Len(), DefaultPoolMax)
	}
}
