//go:build amd64 && !noasm

package simd

//go:noescape
func prefetchT0(p *byte, n int)

// Prefetch asks the CPU to bring the cache lines of b into its caches (one
// PREFETCHT0 per 64 bytes, not waiting for them): a hint that changes no
// result and never faults. Decode attention asks for a run of cache rows
// one run before its kernels read it (package model). It does nothing
// without the assembly (other architectures, the noasm tag). Safe for
// concurrent use.
func Prefetch(b []byte) {
	if len(b) > 0 {
		prefetchT0(&b[0], len(b))
	}
}
