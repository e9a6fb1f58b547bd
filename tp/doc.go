// Package tp is the all-reduce of tensor-parallel worker ranks
// (docs/design.md §11): N ranks each hold a partial sum of the same vector
// and AllReduce leaves the full sum, bit-identical, on every rank.
//
// The reduction runs over a shared Segment: a header (a sense-reversing
// barrier on atomics, an abort word and every rank's pid) and two sets of
// per-rank slots used alternately, so one barrier per round suffices. The
// segment lives in any byte mapping: an anonymous memfd handed to the rank
// processes as a descriptor (CreateSegment, OpenSegment; nothing on the file
// system names it), or a plain Go slice shared by N goroutines (NewLocalGroup,
// which the model's tests use to run N ranks in one process).
//
// Every rank sums the slots in rank order, so the result does not depend on
// the rank computing it. A barrier waits by spinning briefly, then yielding
// for up to 2 ms (a sleep costs a whole millisecond), then sleeping; while
// sleeping it checks the abort word, the peers' pids and Config.Timeout, so
// a dead rank fails the step with ErrPeerDead instead of hanging it. A
// failed reducer stays failed: the rank group is restarted as a whole.
package tp
