package tp

import (
	"errors"
	"time"
)

// AllReducer sums a vector across the ranks of a tensor-parallel group.
// Every rank must call AllReduce the same number of times with vectors of
// the same length, in the same order. An AllReducer is used by one goroutine
// at a time (the forward that owns the rank); Abort may be called from any
// goroutine.
type AllReducer interface {
	// Rank is this rank, in [0, Size()).
	Rank() int
	// Size is the number of ranks (the world size).
	Size() int
	// AllReduce replaces buf with the element-wise sum of every rank's buf.
	// It returns ErrPeerDead, ErrAborted or ErrTimeout when the group
	// cannot complete the round; buf's contents are then undefined and
	// every later call fails too.
	AllReduce(buf []float32) error
	// Abort fails the current and every later AllReduce of every rank of the
	// group (a rank that knows a peer died calls it).
	Abort()
}

// Errors of a round that cannot complete. They are sticky: once a group
// failed, every AllReduce returns the first failure.
var (
	// ErrPeerDead: a rank's process is gone.
	ErrPeerDead = errors.New("tp: a peer rank died")
	// ErrAborted: a rank aborted the group (Abort).
	ErrAborted = errors.New("tp: the rank group was aborted")
	// ErrTimeout: a peer did not reach the barrier within Config.Timeout.
	ErrTimeout = errors.New("tp: a peer rank did not reach the barrier in time")
	// ErrBadSegment: a segment's size or header does not match the group.
	ErrBadSegment = errors.New("tp: bad shared segment")
)

// Defaults of Config.
const (
	// DefaultSlotFloats is the floats one rank's slot holds (1 MiB): a
	// longer vector is reduced in several rounds.
	DefaultSlotFloats = 1 << 18
	// DefaultTimeout bounds one barrier wait for a live peer. Ranks enter a
	// forward within the blend server's RPC timeout of each other, so it is
	// generous; a dead peer is detected at once (pid / abort word).
	DefaultTimeout = time.Minute
	// MaxWorld bounds the world size.
	MaxWorld = 64
)

// Config sizes a group's segment and bounds its waits; the zero value is
// the defaults. All ranks of a group must use the same SlotFloats.
type Config struct {
	// SlotFloats is the floats per rank slot; default DefaultSlotFloats.
	SlotFloats int
	// Timeout bounds one barrier wait; default DefaultTimeout.
	Timeout time.Duration
}

func (c Config) withDefaults() Config {
	if c.SlotFloats <= 0 {
		c.SlotFloats = DefaultSlotFloats
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	return c
}
