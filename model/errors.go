package model

import "errors"

// Sentinel errors. Every error returned by this package for bad input wraps
// exactly one of them (test with errors.Is); the message says which value
// was wrong.
var (
	// ErrBadConfig reports a Config that cannot build a model.
	ErrBadConfig = errors.New("model: bad config")
	// ErrPosition reports a token position outside [0, MaxPositions).
	ErrPosition = errors.New("model: position out of range")
	// ErrBlockTable reports a block table that does not cover every position
	// a forward reads or writes, or that names a block outside the pool.
	ErrBlockTable = errors.New("model: block table too short")
	// ErrToken reports a token id outside [0, Vocab).
	ErrToken = errors.New("model: token id out of vocabulary")
	// ErrLayout reports a KV memory whose layout does not match the model.
	ErrLayout = errors.New("model: KV layout does not match the model")
	// ErrInput reports any other malformed input (empty prompt, overlapping
	// reused ranges, a ratio outside [0, 1], duplicate decode slots...).
	ErrInput = errors.New("model: bad input")
)
