package gguf

// An OpenOption configures Open.
type OpenOption func(*openConfig)

type openConfig struct {
	resident bool
}

// Resident makes Open read the file into memory of the process's own
// (private, anonymous, advised for transparent huge pages with
// MADV_HUGEPAGE, then made read-only) instead of mapping it. A decode step
// streams every weight once; through a file mapping of 4 KiB pages each
// page costs a TLB miss and a restart of the hardware prefetcher, through
// 2 MiB pages it does not. The gain measured on Llama-3.2-1B F16 (2
// threads) is modest: 0–10% a decode step, within the noise of a shared
// machine at batch 1 (cb bench against cb bench --map-weights). The
// price: the file is read whole at Open, and its memory is not shared
// with other processes that have the same file open. Where the kernel
// gives no huge pages (transparent_hugepage=never) the copy is still
// made, in small pages. Without mmap support (non-Unix) Open always reads
// the file.
func Resident() OpenOption { return func(c *openConfig) { c.resident = true } }
