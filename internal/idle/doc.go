// Package idle bounds the silence of an upstream answer: an Activity records
// the time of its last byte (Body records every read that returned bytes),
// and Watch cuts the call once no byte came for a while. The gateway uses it
// for its attempts on engines, a prefill engine for its hand-over to a
// decode engine.
package idle
