package worker

import (
	"fmt"
	"slices"
	"testing"
)

// otherPrompt is a prompt of n tokens unlike prompt(n): English text
// (bytes), repeated as needed.
func otherPrompt(n int) []int32 {
	const text = "Key and value caches of reused documents are blended: a few tokens are recomputed. "
	p := make([]int32, n)
	for i := range p {
		p[i] = int32(text[i%len(text)])
	}
	return p
}

// requireDistinct fails t unless the generated sequences (of different
// inputs) are pairwise different and none is a single token repeated: the
// model's output depends on its input, so a test that compares the outputs
// of two configurations for equality can fail.
func requireDistinct(t *testing.T, outs ...[]int32) {
	t.Helper()
	if err := distinct(outs); err != nil {
		t.Fatal(err)
	}
}

func distinct(outs [][]int32) error {
	for i, a := range outs {
		if len(a) == 0 {
			return fmt.Errorf("output %d is empty", i)
		}
		if len(a) > 1 && slices.IndexFunc(a, func(x int32) bool { return x != a[0] }) < 0 {
			return fmt.Errorf("output %d is one token repeated: %v", i, a)
		}
		for j, b := range outs[:i] {
			if slices.Equal(a, b) {
				return fmt.Errorf("outputs %d and %d of different inputs are equal (%v): comparing outputs proves nothing", j, i, a)
			}
		}
	}
	return nil
}

func TestDistinct(t *testing.T) {
	for _, tc := range []struct {
		name string
		outs [][]int32
		ok   bool
	}{
		{"distinct", [][]int32{{1, 2}, {1, 3}}, true},
		{"equal", [][]int32{{1, 2}, {1, 2}}, false},
		{"repeated", [][]int32{{4, 4, 4}, {1, 2}}, false},
		{"empty", [][]int32{{}, {1}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := distinct(tc.outs); (err == nil) != tc.ok {
				t.Fatalf("distinct(%v) = %v", tc.outs, err)
			}
		})
	}
}
