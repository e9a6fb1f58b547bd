package tp

import (
	"fmt"
	"sync"
	"testing"
)

// BenchmarkAllReduce is one all-reduce of a prefill layer's partial output
// (1,536 tokens × 128 floats, 768 KiB) by a local group of ranks (one
// goroutine each; ns/op is one round of every rank).
func BenchmarkAllReduce(b *testing.B) {
	for _, world := range []int{2, 4} {
		b.Run(fmt.Sprintf("world%d", world), func(b *testing.B) {
			b.ReportAllocs()
			rs, err := NewLocalGroup(world, Config{})
			if err != nil {
				b.Fatal(err)
			}
			const n = 1536 * 128
			b.SetBytes(n * 4)
			var wg sync.WaitGroup
			b.ResetTimer()
			for _, r := range rs {
				wg.Go(func() {
					v := make([]float32, n)
					for range b.N {
						if err := r.AllReduce(v); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
		})
	}
}
