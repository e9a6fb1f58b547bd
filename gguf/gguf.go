package gguf

import (
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/cacheblend/cacheblend/quant"
)

// Sentinel errors. Test them with [errors.Is].
var (
	// ErrFormat is wrapped by every error that [Open] and [Parse] return for
	// a malformed, truncated or unsupported file ("gguf: <detail>: %w").
	ErrFormat = errors.New("invalid GGUF file")
	// ErrMissingKey is wrapped by the typed accessors ([File.String] etc.)
	// when the file has no such metadata key.
	ErrMissingKey = errors.New("missing metadata key")
	// ErrWrongType is wrapped by the typed accessors when the key holds a
	// value of another type (or a value out of the requested range).
	ErrWrongType = errors.New("wrong metadata value type")
)

// ValueType is a GGUF metadata value type (0 uint8 … 12 float64, as in the
// GGUF specification and ggml's enum gguf_type).
type ValueType uint32

// The GGUF metadata value types.
const (
	TypeUint8   ValueType = 0
	TypeInt8    ValueType = 1
	TypeUint16  ValueType = 2
	TypeInt16   ValueType = 3
	TypeUint32  ValueType = 4
	TypeInt32   ValueType = 5
	TypeFloat32 ValueType = 6
	TypeBool    ValueType = 7
	TypeString  ValueType = 8
	TypeArray   ValueType = 9
	TypeUint64  ValueType = 10
	TypeInt64   ValueType = 11
	TypeFloat64 ValueType = 12
)

var valueTypeNames = [...]string{"uint8", "int8", "uint16", "int16", "uint32", "int32",
	"float32", "bool", "string", "array", "uint64", "int64", "float64"}

// String is the type's name ("uint32"), or "type(N)" for an unknown one.
func (t ValueType) String() string {
	if int(t) < len(valueTypeNames) {
		return valueTypeNames[t]
	}
	return "type(" + strconv.FormatUint(uint64(t), 10) + ")"
}

// fixedSize is the encoded size of a scalar of type t, or 0 for string,
// array and unknown types.
func (t ValueType) fixedSize() int {
	switch t {
	case TypeUint8, TypeInt8, TypeBool:
		return 1
	case TypeUint16, TypeInt16:
		return 2
	case TypeUint32, TypeInt32, TypeFloat32:
		return 4
	case TypeUint64, TypeInt64, TypeFloat64:
		return 8
	}
	return 0
}

// minSize is the smallest encoded size of one value of type t (a string is
// at least its 8-byte length, an array its 4-byte type and 8-byte count), or
// 0 for an unknown type.
func (t ValueType) minSize() int {
	switch t {
	case TypeString:
		return 8
	case TypeArray:
		return 12
	}
	return t.fixedSize()
}

// Format limits.
const (
	// DefaultAlignment is the data alignment when general.alignment is absent.
	DefaultAlignment = 32
	// MaxAlignment is the largest general.alignment accepted.
	MaxAlignment = 65536
	// MaxDims is the largest number of tensor dimensions (GGML_MAX_DIMS).
	MaxDims = 4
	// MaxNameLen is the longest tensor name in bytes (GGML_MAX_NAME - 1).
	MaxNameLen = 63
	// MaxArrayDepth is the deepest nesting of arrays (an array of arrays is
	// depth 2).
	MaxArrayDepth = 2
	// KeyAlignment is the metadata key holding the data alignment (uint32).
	KeyAlignment = "general.alignment"
	// KeyArchitecture is the metadata key naming the model architecture.
	KeyArchitecture = "general.architecture"
)

// KV is one metadata entry. Value holds uint8, int8, uint16, int16, uint32,
// int32, float32, bool, string, uint64, int64 or float64 for a scalar; for an
// array a typed Go slice ([]uint8, []int8, []uint16, []int16, []uint32,
// []int32, []float32, []bool, []string, []uint64, []int64, []float64); an
// array of arrays is an []any whose elements are such typed slices.
type KV struct {
	Key   string
	Value any
}

// TensorInfo describes one tensor of the file's tensor index.
type TensorInfo struct {
	Name string
	// Dims are the tensor's extents, ne[0] first; ne[0] is the contiguous
	// row length, as in ggml.
	Dims []uint64
	Type quant.Type
	// Offset is the tensor's offset from the start of the data section.
	Offset uint64
	// Size is the tensor's size in bytes, computed from Dims and Type.
	Size int64
}

// Elements is the number of elements of the tensor (the product of Dims).
func (t *TensorInfo) Elements() int64 {
	n := int64(1)
	for _, d := range t.Dims {
		n *= int64(d)
	}
	return n
}

// Rows is the number of rows of the tensor (Elements / Dims[0]).
func (t *TensorInfo) Rows() int64 {
	if len(t.Dims) == 0 || t.Dims[0] == 0 {
		return 0
	}
	return t.Elements() / int64(t.Dims[0])
}

// File is a parsed GGUF file. Its exported fields are filled by [Open] or
// [Parse] and must not be modified. A File is safe for concurrent use by
// several goroutines, except that [File.Close] must not run concurrently
// with any other method or with use of a [File.Data] slice.
type File struct {
	// Version is the GGUF version (2 or 3).
	Version uint32
	// KV is the metadata, in file order.
	KV []KV
	// Tensors is the tensor index, in file order.
	Tensors []TensorInfo
	// Alignment is general.alignment, default 32.
	Alignment int
	// DataOffset is the absolute offset of the tensor data section: the end
	// of the tensor index rounded up to Alignment. For a file with no tensors
	// it may exceed Size (such files usually omit the padding).
	DataOffset int64
	// Size is the file size in bytes.
	Size int64

	data     []byte // the whole file (mapping or Parse's slice)
	unmap    func([]byte) error
	kvIndex  map[string]int
	tIndex   map[string]int
	idOnce   sync.Once
	identity string
	closed   bool
}

// WriteTensor is one tensor for [Write] and [Encode]. len(Data) must equal
// the size computed from Dims and Type.
type WriteTensor struct {
	Name string
	Dims []uint64 // ne[0] first
	Type quant.Type
	Data []byte
}

// formatError builds an ErrFormat-wrapping error "gguf: <prefix><detail>: invalid GGUF file".
func formatError(prefix, format string, args ...any) error {
	return fmt.Errorf("gguf: %s%s: %w", prefix, fmt.Sprintf(format, args...), ErrFormat)
}
