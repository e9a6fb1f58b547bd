package quant

import "fmt"

// Type is a ggml tensor type, numbered as in ggml.h (the numbers are what a
// GGUF file's tensor index stores).
type Type uint32

// The ggml tensor types. Only those listed in [Type.Supported] can be
// computed; the others are named so that an error can say which type a file
// used.
const (
	F32     Type = 0
	F16     Type = 1
	Q4_0    Type = 2
	Q4_1    Type = 3
	Q5_0    Type = 6
	Q5_1    Type = 7
	Q8_0    Type = 8
	Q8_1    Type = 9
	Q2_K    Type = 10
	Q3_K    Type = 11
	Q4_K    Type = 12
	Q5_K    Type = 13
	Q6_K    Type = 14
	Q8_K    Type = 15
	IQ2_XXS Type = 16
	IQ2_XS  Type = 17
	IQ3_XXS Type = 18
	IQ1_S   Type = 19
	IQ4_NL  Type = 20
	IQ3_S   Type = 21
	IQ2_S   Type = 22
	IQ4_XS  Type = 23
	I8      Type = 24
	I16     Type = 25
	I32     Type = 26
	I64     Type = 27
	F64     Type = 28
	IQ1_M   Type = 29
	BF16    Type = 30
	TQ1_0   Type = 34
	TQ2_0   Type = 35
	MXFP4   Type = 39
)

// QK_K is the super-block size of the K-quants.
const QK_K = 256

// QK8_0 is the block size of Q8_0 and of the other 32-element block types
// (Q4_0, Q4_1, Q5_0, Q5_1).
const QK8_0 = 32

type typeInfo struct {
	name      string
	blockSize int // elements per block
	typeSize  int // bytes per block
}

var types = map[Type]typeInfo{
	F32: {"F32", 1, 4}, F16: {"F16", 1, 2}, BF16: {"BF16", 1, 2}, F64: {"F64", 1, 8},
	I8: {"I8", 1, 1}, I16: {"I16", 1, 2}, I32: {"I32", 1, 4}, I64: {"I64", 1, 8},
	Q4_0: {"Q4_0", 32, 18}, Q4_1: {"Q4_1", 32, 20}, Q5_0: {"Q5_0", 32, 22}, Q5_1: {"Q5_1", 32, 24},
	Q8_0: {"Q8_0", 32, 34}, Q8_1: {"Q8_1", 32, 36},
	Q2_K: {"Q2_K", QK_K, 84}, Q3_K: {"Q3_K", QK_K, 110}, Q4_K: {"Q4_K", QK_K, 144},
	Q5_K: {"Q5_K", QK_K, 176}, Q6_K: {"Q6_K", QK_K, 210}, Q8_K: {"Q8_K", QK_K, 292},
	IQ2_XXS: {"IQ2_XXS", QK_K, 66}, IQ2_XS: {"IQ2_XS", QK_K, 74}, IQ3_XXS: {"IQ3_XXS", QK_K, 98},
	IQ1_S: {"IQ1_S", QK_K, 50}, IQ4_NL: {"IQ4_NL", 32, 18}, IQ3_S: {"IQ3_S", QK_K, 110},
	IQ2_S: {"IQ2_S", QK_K, 82}, IQ4_XS: {"IQ4_XS", QK_K, 136}, IQ1_M: {"IQ1_M", QK_K, 56},
	TQ1_0: {"TQ1_0", QK_K, 54}, TQ2_0: {"TQ2_0", QK_K, 66}, MXFP4: {"MXFP4", 32, 17},
}

// String is the type's ggml name ("Q4_K"), or "type(N)" for an unknown one.
func (t Type) String() string {
	if ti, ok := types[t]; ok {
		return ti.name
	}
	return fmt.Sprintf("type(%d)", uint32(t))
}

// Known reports whether t is a ggml type whose block layout this package
// knows (so a tensor's byte size can be computed), whether or not it can be
// computed.
func (t Type) Known() bool { _, ok := types[t]; return ok }

// BlockSize is the number of elements in one block of t (1 for the float
// types), or 0 for an unknown type.
func (t Type) BlockSize() int { return types[t].blockSize }

// TypeSize is the number of bytes of one block of t, or 0 for an unknown
// type.
func (t Type) TypeSize() int { return types[t].typeSize }

// RowBytes is the byte size of a row of n elements of type t. It fails for an
// unknown type and for n that is negative or not a multiple of the block size.
func (t Type) RowBytes(n int) (int, error) {
	ti, ok := types[t]
	if !ok {
		return 0, fmt.Errorf("quant: unknown tensor type %d", uint32(t))
	}
	if n < 0 || n%ti.blockSize != 0 {
		return 0, fmt.Errorf("quant: row of %d elements is not a whole number of %s blocks of %d", n, ti.name, ti.blockSize)
	}
	return n / ti.blockSize * ti.typeSize, nil
}
