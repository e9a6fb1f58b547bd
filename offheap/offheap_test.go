package offheap

import (
	"testing"
)

func TestFloats(t *testing.T) {
	for _, tc := range []struct {
		name string
		n    int
	}{
		{"one", 1},
		{"a page", pageSize / 4},
		{"a page and one", pageSize/4 + 1},
		{"4 MiB", 1 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Floats(tc.n)
			if err != nil {
				t.Fatal(err)
			}
			if len(s) != tc.n || cap(s)*4%pageSize != 0 || cap(s) < tc.n || cap(s)-tc.n >= pageSize/4 {
				t.Fatalf("len %d cap %d for %d floats", len(s), cap(s), tc.n)
			}
			for i, v := range s[:cap(s)] {
				if v != 0 {
					t.Fatalf("s[%d] = %g, want a zeroed buffer", i, v)
				}
			}
			// Writable over its whole capacity.
			full := s[:cap(s)]
			for i := range full {
				full[i] = float32(i)
			}
			if full[cap(s)-1] != float32(cap(s)-1) {
				t.Fatal("last float not kept")
			}
			if err := Free(s[:0]); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestBadInput(t *testing.T) {
	for _, n := range []int{0, -1, 1 << 62} {
		if _, err := Floats(n); err == nil {
			t.Errorf("Floats(%d): no error", n)
		}
	}
	if err := Free(nil); err == nil {
		t.Error("Free(nil): no error")
	}
	if err := Free(make([]float32, 3)); err == nil {
		t.Error("Free of a heap slice of 3: no error")
	}
}

func BenchmarkFloats(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		s, err := Floats(1 << 18)
		if err != nil {
			b.Fatal(err)
		}
		if err := Free(s); err != nil {
			b.Fatal(err)
		}
	}
}
