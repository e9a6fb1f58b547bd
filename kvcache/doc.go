// Package kvcache holds the paged KV-cache memory shared between cb-worker and
// cb-blend: a [Layout] descriptor, slot-mapping helpers and [Memory], a
// pathless shared mapping that the worker creates ([Create]: a memfd sealed
// against resizing, or an unlinked 0600 file when memfd_create is
// unavailable) and whose descriptor the blend server maps ([Map]: checked
// with fstat, never opened by path), so the server can scatter reused KV
// straight into the worker's cache (our analogue of CUDA IPC). The
// descriptor travels over a Unix socket (package rpc/kvsock).
//
// Memory layout: for every layer l, the K plane then the V plane, each of
// shape [NumBlocks, BlockSize, KVHeads, HeadDim] of the layout's element
// type ([DType]: F16, as llama.cpp's cache, or F32; little endian on the
// machines this runs on). [Memory.Read] and [Memory.Write] convert rows
// from and to float32 whatever the type. The slot of token position pos of
// a request with block table bt is bt[pos/BlockSize]*BlockSize +
// pos%BlockSize.
package kvcache
