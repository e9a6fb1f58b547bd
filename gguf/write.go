package gguf

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
)

// Write writes a GGUF version 3 file holding kv (in order) and tensors (in
// order, each padded with zeros to the alignment): general.alignment in kv,
// which must then be a uint32 power of two in [1, 65536], else 32. The
// input is validated first (see [Encode]); nothing is written when it is
// invalid. Write is safe for concurrent use (it keeps no state).
func Write(w io.Writer, kv []KV, tensors []WriteTensor) error {
	header, align, err := encodeIndex(kv, tensors)
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(w, 1<<16)
	if _, err := bw.Write(header); err != nil {
		return fmt.Errorf("gguf: write: %w", err)
	}
	var zeros [MaxAlignment]byte
	for _, t := range tensors {
		if _, err := bw.Write(t.Data); err != nil {
			return fmt.Errorf("gguf: write tensor %q: %w", t.Name, err)
		}
		if pad := int(alignUp(int64(len(t.Data)), align)) - len(t.Data); pad > 0 {
			if _, err := bw.Write(zeros[:pad]); err != nil {
				return fmt.Errorf("gguf: write: %w", err)
			}
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("gguf: write: %w", err)
	}
	return nil
}

// Encode returns the GGUF version 3 file that [Write] writes. It fails,
// naming the problem, for an empty or duplicate key, a value whose Go type
// is not one of those listed at [KV] (or nested deeper than
// [MaxArrayDepth]), a bad general.alignment, and a tensor with an empty,
// duplicate or too long name, bad dims, an unknown type, a row length that
// is not a multiple of the block size, or Data of the wrong length.
func Encode(kv []KV, tensors []WriteTensor) ([]byte, error) {
	header, align, err := encodeIndex(kv, tensors)
	if err != nil {
		return nil, err
	}
	total := int64(len(header))
	for _, t := range tensors {
		total += alignUp(int64(len(t.Data)), align)
	}
	if total > math.MaxInt {
		return nil, errors.New("gguf: encode: file too large")
	}
	out := make([]byte, total)
	n := copy(out, header)
	for _, t := range tensors {
		copy(out[n:], t.Data)
		n += int(alignUp(int64(len(t.Data)), align))
	}
	return out, nil
}

// encodeIndex validates the input and encodes bytes [0, DataOffset): the
// header, metadata, tensor index and padding. It returns the alignment.
func encodeIndex(kv []KV, tensors []WriteTensor) ([]byte, int64, error) {
	align := int64(DefaultAlignment)
	seen := make(map[string]bool, len(kv))
	for _, e := range kv {
		if e.Key == "" {
			return nil, 0, errors.New("gguf: encode: empty metadata key")
		}
		if seen[e.Key] {
			return nil, 0, fmt.Errorf("gguf: encode: duplicate metadata key %q", e.Key)
		}
		seen[e.Key] = true
		if e.Key == KeyAlignment {
			a, ok := e.Value.(uint32)
			if !ok {
				return nil, 0, fmt.Errorf("gguf: encode: %s must be uint32, is %T", KeyAlignment, e.Value)
			}
			if a == 0 || a > MaxAlignment || a&(a-1) != 0 {
				return nil, 0, fmt.Errorf("gguf: encode: alignment %d is not a power of two in [1, %d]", a, MaxAlignment)
			}
			align = int64(a)
		}
	}
	var b bytes.Buffer
	le := binary.LittleEndian
	b.Write(magic[:])
	b.Write(le.AppendUint32(nil, 3))
	b.Write(le.AppendUint64(nil, uint64(len(tensors))))
	b.Write(le.AppendUint64(nil, uint64(len(kv))))
	for _, e := range kv {
		t, ok := valueTypeOf(e.Value)
		if !ok {
			return nil, 0, fmt.Errorf("gguf: encode: key %q: unsupported value type %T", e.Key, e.Value)
		}
		writeString(&b, e.Key)
		b.Write(le.AppendUint32(nil, uint32(t)))
		if err := writeValue(&b, e.Value, 0); err != nil {
			return nil, 0, fmt.Errorf("gguf: encode: key %q: %w", e.Key, err)
		}
	}
	names := make(map[string]bool, len(tensors))
	var offset int64
	for i, t := range tensors {
		if t.Name == "" {
			return nil, 0, fmt.Errorf("gguf: encode: tensor %d has no name", i)
		}
		if len(t.Name) > MaxNameLen {
			return nil, 0, fmt.Errorf("gguf: encode: tensor %q: name of %d bytes is longer than %d", t.Name, len(t.Name), MaxNameLen)
		}
		if names[t.Name] {
			return nil, 0, fmt.Errorf("gguf: encode: duplicate tensor name %q", t.Name)
		}
		names[t.Name] = true
		size, err := tensorSize(t.Dims, t.Type)
		if err != nil {
			return nil, 0, fmt.Errorf("gguf: encode: tensor %q: %w", t.Name, err)
		}
		if int64(len(t.Data)) != size {
			return nil, 0, fmt.Errorf("gguf: encode: tensor %q: data is %d bytes, %v %v needs %d", t.Name, len(t.Data), t.Type, t.Dims, size)
		}
		writeString(&b, t.Name)
		b.Write(le.AppendUint32(nil, uint32(len(t.Dims))))
		for _, d := range t.Dims {
			b.Write(le.AppendUint64(nil, d))
		}
		b.Write(le.AppendUint32(nil, uint32(t.Type)))
		b.Write(le.AppendUint64(nil, uint64(offset)))
		offset += alignUp(size, align)
	}
	if pad := alignUp(int64(b.Len()), align) - int64(b.Len()); pad > 0 {
		b.Write(make([]byte, pad))
	}
	return b.Bytes(), align, nil
}

func writeString(b *bytes.Buffer, s string) {
	b.Write(binary.LittleEndian.AppendUint64(nil, uint64(len(s))))
	b.WriteString(s)
}

// goTypes are the Go types of the values of each ValueType but TypeArray
// (see [KV]).
var goTypes = [...]reflect.Type{
	TypeUint8: reflect.TypeFor[uint8](), TypeInt8: reflect.TypeFor[int8](),
	TypeUint16: reflect.TypeFor[uint16](), TypeInt16: reflect.TypeFor[int16](),
	TypeUint32: reflect.TypeFor[uint32](), TypeInt32: reflect.TypeFor[int32](),
	TypeFloat32: reflect.TypeFor[float32](), TypeBool: reflect.TypeFor[bool](),
	TypeString: reflect.TypeFor[string](), TypeUint64: reflect.TypeFor[uint64](),
	TypeInt64: reflect.TypeFor[int64](), TypeFloat64: reflect.TypeFor[float64](),
}

// valueTypeOf maps a Go value to its GGUF type (TypeArray for slices).
func valueTypeOf(v any) (ValueType, bool) {
	rt := reflect.TypeOf(v)
	for t, g := range goTypes {
		if g != nil && rt == g {
			return ValueType(t), true
		}
	}
	_, _, ok := elemType(v)
	return TypeArray, ok
}

// elemType is the GGUF element type and the length of a slice value (an
// []any is an array of arrays).
func elemType(v any) (ValueType, int, bool) {
	rt := reflect.TypeOf(v)
	if x, ok := v.([]any); ok {
		return TypeArray, len(x), true
	}
	for t, g := range goTypes {
		if g != nil && rt == reflect.SliceOf(g) {
			return ValueType(t), reflect.ValueOf(v).Len(), true
		}
	}
	return 0, 0, false
}

// writeValue encodes v (without its type tag); depth counts the arrays
// around it.
func writeValue(b *bytes.Buffer, v any, depth int) error {
	le := binary.LittleEndian
	var buf [8]byte
	switch x := v.(type) {
	case uint8:
		b.WriteByte(x)
	case int8:
		b.WriteByte(byte(x))
	case bool:
		if x {
			b.WriteByte(1)
		} else {
			b.WriteByte(0)
		}
	case uint16:
		b.Write(le.AppendUint16(buf[:0], x))
	case int16:
		b.Write(le.AppendUint16(buf[:0], uint16(x)))
	case uint32:
		b.Write(le.AppendUint32(buf[:0], x))
	case int32:
		b.Write(le.AppendUint32(buf[:0], uint32(x)))
	case float32:
		b.Write(le.AppendUint32(buf[:0], math.Float32bits(x)))
	case uint64:
		b.Write(le.AppendUint64(buf[:0], x))
	case int64:
		b.Write(le.AppendUint64(buf[:0], uint64(x)))
	case float64:
		b.Write(le.AppendUint64(buf[:0], math.Float64bits(x)))
	case string:
		writeString(b, x)
	default:
		et, n, ok := elemType(v)
		if !ok {
			return fmt.Errorf("unsupported value type %T", v)
		}
		if depth >= MaxArrayDepth || (et == TypeArray && depth+2 > MaxArrayDepth) {
			return fmt.Errorf("arrays nested deeper than %d", MaxArrayDepth)
		}
		b.Write(le.AppendUint32(buf[:0], uint32(et)))
		b.Write(le.AppendUint64(buf[:0], uint64(n)))
		if et == TypeArray {
			for i, e := range v.([]any) {
				if _, _, isSlice := elemType(e); !isSlice {
					return fmt.Errorf("element %d of an array of arrays is %T, not an array", i, e)
				}
				if err := writeValue(b, e, depth+1); err != nil {
					return fmt.Errorf("element %d: %w", i, err)
				}
			}
			return nil
		}
		return writeElems(b, v)
	}
	return nil
}

// writeElems encodes the elements of a typed scalar or string slice.
func writeElems(b *bytes.Buffer, v any) error {
	switch x := v.(type) {
	case []uint8:
		b.Write(x)
	case []string:
		for _, s := range x {
			writeString(b, s)
		}
	default:
		// binary.Write handles the fixed-size slices (bool as 0/1) in
		// little-endian order.
		if err := binary.Write(b, binary.LittleEndian, v); err != nil {
			return err
		}
	}
	return nil
}
