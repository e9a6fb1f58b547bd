package offheap

import (
	"runtime"
	"testing"
	"unsafe"
)

// TestMake covers element types of every width: the mapping is sized in
// bytes, the slice in elements.
func TestMake(t *testing.T) {
	check := func(t *testing.T, n, size, length, capacity int) {
		t.Helper()
		if length != n || capacity < n || capacity*size%pageSize != 0 || (capacity-n)*size >= pageSize {
			t.Fatalf("len %d cap %d for %d elements of %d bytes", length, capacity, n, size)
		}
	}
	for _, tc := range []struct {
		name string
		run  func(t *testing.T)
	}{
		{"int8 page+1", func(t *testing.T) {
			s, err := Make[int8](pageSize + 1)
			if err != nil {
				t.Fatal(err)
			}
			check(t, pageSize+1, 1, len(s), cap(s))
			s[:cap(s)][cap(s)-1] = 7
			if err := Release(s); err != nil {
				t.Fatal(err)
			}
		}},
		{"uint32 1000", func(t *testing.T) {
			s, err := Make[uint32](1000)
			if err != nil {
				t.Fatal(err)
			}
			check(t, 1000, 4, len(s), cap(s))
			full := s[:cap(s)]
			for i := range full {
				if full[i] != 0 {
					t.Fatalf("s[%d] = %d, want zero", i, full[i])
				}
				full[i] = uint32(i)
			}
			if err := Release(s[:1]); err != nil {
				t.Fatal(err)
			}
		}},
		{"float64 a page", func(t *testing.T) {
			s, err := Make[float64](pageSize / 8)
			if err != nil {
				t.Fatal(err)
			}
			check(t, pageSize/8, 8, len(s), cap(s))
			if uintptr(unsafe.Pointer(&s[0]))%uintptr(pageSize) != 0 {
				t.Fatal("mapping not page-aligned")
			}
			if err := Release(s); err != nil {
				t.Fatal(err)
			}
		}},
		{"bad sizes", func(t *testing.T) {
			if _, err := Make[float64](0); err == nil {
				t.Error("Make[float64](0): no error")
			}
			if _, err := Make[float64](1 << 60); err == nil {
				t.Error("Make[float64](1<<60): no error")
			}
			if err := Release(make([]int16, 10)); err == nil {
				t.Error("Release of a heap slice: no error")
			}
		}},
	} {
		t.Run(tc.name, tc.run)
	}
}

func TestBuf(t *testing.T) {
	big := BufMin/4 + 1 // float32s: just over BufMin bytes
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, b *Buf[float32])
	}{
		{"zero value", func(t *testing.T, b *Buf[float32]) {
			if s := b.Grow(0); len(s) != 0 || b.Mapped() {
				t.Fatalf("Grow(0) = len %d, mapped %v", len(s), b.Mapped())
			}
			b.Free()
			b.Free() // twice is fine
		}},
		{"small stays on the heap", func(t *testing.T, b *Buf[float32]) {
			s := b.Grow(100)
			if len(s) != 100 || cap(s) != 125 || b.Mapped() {
				t.Fatalf("len %d cap %d mapped %v, want 100, 125, heap", len(s), cap(s), b.Mapped())
			}
		}},
		{"large is mapped with headroom", func(t *testing.T, b *Buf[float32]) {
			s := b.Grow(big)
			if len(s) != big || cap(s) < big+big/4 || !b.Mapped() {
				t.Fatalf("len %d cap %d mapped %v", len(s), cap(s), b.Mapped())
			}
		}},
		{"within capacity keeps contents", func(t *testing.T, b *Buf[float32]) {
			s := b.Grow(big)
			s[0], s[big-1] = 1, 2
			s2 := b.Grow(big + big/8)
			if &s2[0] != &s[0] || s2[0] != 1 || s2[big-1] != 2 {
				t.Fatal("a grow within the capacity moved or lost the contents")
			}
			if s3 := b.Grow(10); &s3[0] != &s[0] {
				t.Fatal("shrinking moved the buffer")
			}
		}},
		{"beyond capacity reallocates zeroed", func(t *testing.T, b *Buf[float32]) {
			s := b.Grow(100)
			s[0] = 5
			s2 := b.Grow(4 * big)
			if len(s2) != 4*big || !b.Mapped() || s2[0] != 0 {
				t.Fatalf("len %d mapped %v first %g, want %d, mapped, 0", len(s2), b.Mapped(), s2[0], 4*big)
			}
		}},
		{"free empties", func(t *testing.T, b *Buf[float32]) {
			b.Grow(big)
			b.Free()
			if b.Mapped() || cap(b.Grow(0)) != 0 {
				t.Fatal("Free left a buffer")
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b Buf[float32]
			tc.run(t, &b)
			b.Free()
		})
	}
}

// TestBufCleanup: a Buf registered as its owner's cleanup is released once
// the owner is collected.
func TestBufCleanup(t *testing.T) {
	type owner struct{ mem *Buf[uint32] }
	done := make(chan bool, 1)
	func() {
		o := &owner{mem: new(Buf[uint32])}
		o.mem.Grow(BufMin)
		runtime.AddCleanup(o, func(b *Buf[uint32]) {
			b.Free()
			done <- b.Mapped()
		}, o.mem)
	}()
	for range 100 {
		runtime.GC()
		select {
		case mapped := <-done:
			if mapped {
				t.Fatal("still mapped after the cleanup")
			}
			return
		default:
		}
	}
	t.Fatal("the owner's cleanup never ran")
}

func BenchmarkBufGrow(b *testing.B) {
	b.ReportAllocs()
	var buf Buf[uint32]
	defer buf.Free()
	for i := range b.N {
		buf.Grow(BufMin/4 + i%1024)
	}
}
