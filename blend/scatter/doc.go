// Package scatter is the retrieve data path of the blend server: it copies
// matched token ranges of stored chunks into a worker's paged KV memory
// (package kvcache), slot by slot, slot = block_table[pos/bs]*bs + pos%bs.
//
// It takes the reuse plan's segments (reuseplan.Segment) as the blend
// server's retrieve windowed them (reuseplan.Window: what a pass writes is
// decided there, once). Only the matched slots are written, so a partial
// block holding reused and recomputed tokens is correct. K of
// non-prefix matches is re-RoPE'd from the position it was stored at to its
// new position with rope.RoPE.Shift; prefix matches are copied as stored.
// [Gather] is the opposite direction, used to store a prefilled sequence.
//
// [Pool] is a small copy "stream": workers running scatter jobs off a bounded
// queue, recording when each copy finished (the END event's time). When the
// queue is full the submitter runs the copy inline instead of dropping KV.
package scatter
