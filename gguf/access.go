package gguf

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"slices"
	"strconv"
)

// Tensor returns the index entry of the tensor called name. The pointer
// refers into f.Tensors.
func (f *File) Tensor(name string) (*TensorInfo, bool) {
	i, ok := f.tIndex[name]
	if !ok {
		return nil, false
	}
	return &f.Tensors[i], true
}

// Data returns the bytes of tensor t (an entry of f.Tensors), aliasing the
// file's mapping (or Parse's slice): no copy is made, the slice must not be
// written, and it becomes invalid after [File.Close]. It returns nil when t
// does not fit the file or f is closed.
func (f *File) Data(t *TensorInfo) []byte {
	if f.closed || t == nil || t.Size < 0 || f.DataOffset > f.Size {
		return nil
	}
	room := uint64(f.Size - f.DataOffset)
	if t.Offset > room || uint64(t.Size) > room-t.Offset {
		return nil
	}
	start := f.DataOffset + int64(t.Offset)
	end := start + t.Size
	return f.data[start:end:end]
}

// Get returns the value of metadata key key (see [KV] for the Go types).
func (f *File) Get(key string) (any, bool) {
	i, ok := f.kvIndex[key]
	if !ok {
		return nil, false
	}
	return f.KV[i].Value, true
}

// Release removes the metadata entries of keys (absent ones are ignored)
// once a caller has copied what it needs out of them — the tokenizer's
// arrays, megabytes of strings, once the vocabulary is built — so that
// their memory can be collected; Get then reports them missing. Identity
// is unchanged. Not safe for concurrent use with readers of f's metadata.
func (f *File) Release(keys ...string) {
	drop := false
	for _, k := range keys {
		if _, ok := f.kvIndex[k]; ok {
			drop = true
		}
	}
	if !drop {
		return
	}
	f.KV = slices.DeleteFunc(f.KV, func(kv KV) bool { return slices.Contains(keys, kv.Key) })
	clear(f.kvIndex)
	for i, kv := range f.KV {
		f.kvIndex[kv.Key] = i
	}
}

func (f *File) lookup(key string) (any, error) {
	v, ok := f.Get(key)
	if !ok {
		return nil, fmt.Errorf("gguf: key %q: %w", key, ErrMissingKey)
	}
	return v, nil
}

func wrongType(key string, v any, want string) error {
	return fmt.Errorf("gguf: key %q is %s, want %s: %w", key, goTypeName(v), want, ErrWrongType)
}

// typed returns the value of key when it is a T; want names T in the error.
func typed[T any](f *File, key, want string) (T, error) {
	var x T
	v, err := f.lookup(key)
	if err != nil {
		return x, err
	}
	x, ok := v.(T)
	if !ok {
		return x, wrongType(key, v, want)
	}
	return x, nil
}

// String returns the string value of key.
func (f *File) String(key string) (string, error) { return typed[string](f, key, "string") }

// asInt64 converts an integer value to int64; ok is false for a non-integer
// and for a uint64 above MaxInt64 (then big reports it).
func asInt64(v any) (n int64, big, ok bool) {
	switch x := v.(type) {
	case uint8:
		return int64(x), false, true
	case int8:
		return int64(x), false, true
	case uint16:
		return int64(x), false, true
	case int16:
		return int64(x), false, true
	case uint32:
		return int64(x), false, true
	case int32:
		return int64(x), false, true
	case int64:
		return x, false, true
	case uint64:
		if x > math.MaxInt64 {
			return 0, true, false
		}
		return int64(x), false, true
	}
	return 0, false, false
}

// Uint returns the value of key as a uint64. Any unsigned integer type is
// accepted, and a signed one when it is not negative.
func (f *File) Uint(key string) (uint64, error) {
	v, err := f.lookup(key)
	if err != nil {
		return 0, err
	}
	if u, ok := v.(uint64); ok {
		return u, nil
	}
	n, _, ok := asInt64(v)
	if !ok {
		return 0, wrongType(key, v, "an unsigned integer")
	}
	if n < 0 {
		return 0, fmt.Errorf("gguf: key %q is negative (%d), want an unsigned integer: %w", key, n, ErrWrongType)
	}
	return uint64(n), nil
}

// Int returns the value of key as an int64. Any integer type is accepted,
// a uint64 only when it fits.
func (f *File) Int(key string) (int64, error) {
	v, err := f.lookup(key)
	if err != nil {
		return 0, err
	}
	n, big, ok := asInt64(v)
	if big {
		return 0, fmt.Errorf("gguf: key %q: %d overflows int64: %w", key, v, ErrWrongType)
	}
	if !ok {
		return 0, wrongType(key, v, "an integer")
	}
	return n, nil
}

// Float returns the value of key as a float64: float32, float64 and the
// integer types are accepted.
func (f *File) Float(key string) (float64, error) {
	v, err := f.lookup(key)
	if err != nil {
		return 0, err
	}
	switch x := v.(type) {
	case float32:
		return float64(x), nil
	case float64:
		return x, nil
	case uint64:
		return float64(x), nil
	}
	n, _, ok := asInt64(v)
	if !ok {
		return 0, wrongType(key, v, "a number")
	}
	return float64(n), nil
}

// Bool returns the bool value of key.
func (f *File) Bool(key string) (bool, error) { return typed[bool](f, key, "bool") }

// Strings returns the string array value of key. The slice is shared with
// f.KV: do not modify it.
func (f *File) Strings(key string) ([]string, error) {
	return typed[[]string](f, key, "string array")
}

// Float32s returns the float32 array value of key (shared with f.KV: do not
// modify it). A float64 array is converted.
func (f *File) Float32s(key string) ([]float32, error) {
	v, err := f.lookup(key)
	if err != nil {
		return nil, err
	}
	switch x := v.(type) {
	case []float32:
		return x, nil
	case []float64:
		out := make([]float32, len(x))
		for i, e := range x {
			out[i] = float32(e)
		}
		return out, nil
	}
	return nil, wrongType(key, v, "float32 array")
}

// Int32s returns the int32 array value of key (shared with f.KV: do not
// modify it). Other integer arrays are converted when every element fits in
// an int32; otherwise the error wraps ErrWrongType and names the element.
func (f *File) Int32s(key string) ([]int32, error) {
	v, err := f.lookup(key)
	if err != nil {
		return nil, err
	}
	switch x := v.(type) {
	case []int32:
		return x, nil
	case []uint8:
		return toInt32s(key, x)
	case []int8:
		return toInt32s(key, x)
	case []uint16:
		return toInt32s(key, x)
	case []int16:
		return toInt32s(key, x)
	case []uint32:
		return toInt32s(key, x)
	case []int64:
		return toInt32s(key, x)
	case []uint64:
		return toInt32s(key, x)
	}
	return nil, wrongType(key, v, "integer array")
}

// toInt32s converts the integer array value of key to int32s, failing on
// the first element out of the int32 range.
func toInt32s[T uint8 | int8 | uint16 | int16 | uint32 | int64 | uint64](key string, x []T) ([]int32, error) {
	out := make([]int32, len(x))
	for i, e := range x {
		// e fits when it survives the round trip and keeps its sign.
		if n := int32(e); T(n) != e || (n < 0) != (e < 0) {
			return nil, fmt.Errorf("gguf: key %q: element %d is out of the int32 range: %w", key, i, ErrWrongType)
		}
		out[i] = int32(e)
	}
	return out, nil
}

// Architecture returns general.architecture, or "" when it is absent or not
// a string.
func (f *File) Architecture() string {
	s, _ := f.String(KeyArchitecture)
	return s
}

// Identity returns "gguf-<size>-<hex sha256 of bytes [0, DataOffset)>": the
// header, metadata and tensor index (never the tensor data, so it is cheap).
// Two processes compare identities to be sure they hold the same file. It is
// computed once, on first use (or by [File.Close]), and safe for concurrent
// use.
func (f *File) Identity() string {
	f.idOnce.Do(func() {
		end := min(f.DataOffset, f.Size)
		sum := sha256.Sum256(f.data[:end])
		f.identity = "gguf-" + strconv.FormatInt(f.Size, 10) + "-" + hex.EncodeToString(sum[:])
	})
	return f.identity
}

// Close releases the file's memory mapping (for a File from [Parse] it does
// nothing). Slices returned by [File.Data] become invalid; the metadata,
// tensor index and [File.Identity] stay usable. Closing twice is harmless.
func (f *File) Close() error {
	if f.closed {
		return nil
	}
	f.Identity()
	f.closed = true
	data := f.data
	f.data = nil
	if f.unmap != nil {
		if err := f.unmap(data); err != nil {
			return fmt.Errorf("gguf: unmap: %w", err)
		}
	}
	return nil
}
