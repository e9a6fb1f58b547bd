package gguf

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/cacheblend/cacheblend/quant"
)

// raw builds GGUF bytes by hand, so that a test can write anything.
type raw struct{ b []byte }

func (r *raw) u8(v uint8) *raw   { r.b = append(r.b, v); return r }
func (r *raw) u32(v uint32) *raw { r.b = binary.LittleEndian.AppendUint32(r.b, v); return r }
func (r *raw) u64(v uint64) *raw { r.b = binary.LittleEndian.AppendUint64(r.b, v); return r }
func (r *raw) str(s string) *raw { r.u64(uint64(len(s))); r.b = append(r.b, s...); return r }

// header starts a version 3 file.
func header(nTensors, nKV uint64) *raw {
	r := &raw{b: []byte("GGUF")}
	return r.u32(3).u64(nTensors).u64(nKV)
}

// tensor appends one tensor index entry.
func (r *raw) tensor(name string, typ quant.Type, offset uint64, dims ...uint64) *raw {
	r.str(name).u32(uint32(len(dims)))
	for _, d := range dims {
		r.u64(d)
	}
	return r.u32(uint32(typ)).u64(offset)
}

// data pads to the alignment a and appends n bytes of tensor data.
func (r *raw) data(a, n int) *raw {
	for len(r.b)%a != 0 {
		r.b = append(r.b, 0)
	}
	r.b = append(r.b, make([]byte, n)...)
	return r
}

// TestBadFiles: each malformed file fails with ErrFormat and an error
// naming the problem.
func TestBadFiles(t *testing.T) {
	big := uint64(1) << 60
	for _, tc := range []struct {
		name string
		file []byte
		sub  string
	}{
		{"empty", nil, "magic: truncated"},
		{"wrong magic", []byte("GGML\x03\x00\x00\x00"), `bad magic "GGML"`},
		{"version 1", (&raw{b: []byte("GGUF")}).u32(1).u64(0).u64(0).b, "version 1 is not supported"},
		{"version 4", (&raw{b: []byte("GGUF")}).u32(4).u64(0).u64(0).b, "unsupported version 4"},
		{"version 0", (&raw{b: []byte("GGUF")}).u32(0).u64(0).u64(0).b, "unsupported version 0"},
		{"big-endian", (&raw{b: []byte("GGUF")}).u32(3 << 24).u64(0).u64(0).b, "big-endian"},
		{"truncated header", []byte("GGUF\x03\x00\x00\x00\x00\x00"), "tensor count: truncated at offset 8"},
		{"absurd kv count", header(0, big).b, "metadata count 1152921504606846976 exceeds"},
		{"absurd tensor count", header(big, 0).b, "tensor count 1152921504606846976 exceeds"},
		{"kv count past data", header(0, 2).str("a").u32(uint32(TypeUint8)).u8(1).b, "metadata count 2 exceeds"},
		{"absurd key length", header(0, 1).u64(big).u32(0).u8(0).b, "metadata key 0: string length 1152921504606846976 exceeds"},
		{"empty key", header(0, 1).str("").u32(uint32(TypeUint8)).u8(1).b, "metadata key 0 is empty"},
		{"duplicate key", header(0, 2).str("k").u32(0).u8(1).str("k").u32(0).u8(2).b, `duplicate metadata key "k"`},
		{"unknown value type", header(0, 1).str("k").u32(13).u64(0).b, `key "k": unknown value type 13`},
		{"truncated value", header(0, 1).str("k").u32(uint32(TypeUint64)).u32(0).b, `key "k": truncated`},
		{"absurd string length", header(0, 1).str("k").u32(uint32(TypeString)).u64(big).b, `key "k": string length 1152921504606846976 exceeds`},
		{"bad bool", header(0, 1).str("k").u32(uint32(TypeBool)).u8(2).b, `key "k": bool byte 2`},
		{"bad bool in array", header(0, 1).str("k").u32(uint32(TypeArray)).u32(uint32(TypeBool)).u64(2).u8(1).u8(7).b, "element 1: bool byte 7"},
		{"absurd array count", header(0, 1).str("k").u32(uint32(TypeArray)).u32(uint32(TypeUint8)).u64(big).b, `key "k": array count 1152921504606846976 of uint8 exceeds`},
		{"absurd string array count", header(0, 1).str("k").u32(uint32(TypeArray)).u32(uint32(TypeString)).u64(big).u64(0).b, "array count 1152921504606846976 of string"},
		{"absurd nested array count", header(0, 1).str("k").u32(uint32(TypeArray)).u32(uint32(TypeArray)).u64(big).u64(0).u32(0).b, "array count 1152921504606846976 of array"},
		{"absurd string in array", header(0, 1).str("k").u32(uint32(TypeArray)).u32(uint32(TypeString)).u64(1).u64(big).b, "element 0: string length 1152921504606846976"},
		{"array of unknown", header(0, 1).str("k").u32(uint32(TypeArray)).u32(99).u64(0).b, "array of unknown value type 99"},
		{"arrays nested 3 deep", header(0, 1).str("k").u32(uint32(TypeArray)).u32(uint32(TypeArray)).u64(1).
			u32(uint32(TypeArray)).u64(1).u32(uint32(TypeUint8)).u64(0).b, "arrays nested deeper than 2"},
		{"alignment not uint32", header(0, 1).str(KeyAlignment).u32(uint32(TypeUint64)).u64(32).b, `"general.alignment" must be uint32, is uint64`},
		{"alignment zero", header(0, 1).str(KeyAlignment).u32(uint32(TypeUint32)).u32(0).b, "alignment 0 is not a power of two"},
		{"alignment 48", header(0, 1).str(KeyAlignment).u32(uint32(TypeUint32)).u32(48).b, "alignment 48 is not a power of two"},
		{"alignment too big", header(0, 1).str(KeyAlignment).u32(uint32(TypeUint32)).u32(1 << 17).b, "alignment 131072"},
		{"tensor count past data", header(3, 0).tensor("a", quant.F32, 0, 8).data(32, 32).b, "tensor count 3 exceeds"},
		{"absurd tensor name", header(1, 0).u64(big).u32(1).u64(1).u32(0).u64(0).b, "tensor 0 name: string length 1152921504606846976"},
		{"long tensor name", header(1, 0).tensor(strings.Repeat("x", 64), quant.F32, 0, 8).data(32, 32).b, "tensor 0: name of 64 bytes is longer than 63"},
		{"empty tensor name", header(1, 0).tensor("", quant.F32, 0, 8).data(32, 32).b, "tensor 0 has an empty name"},
		{"zero dims", header(1, 0).tensor("t", quant.F32, 0).u64(0).u64(0).data(32, 32).b, `tensor "t": n_dims 0 not in [1, 4]`},
		{"five dims", header(1, 0).tensor("t", quant.F32, 0, 1, 1, 1, 1, 1).data(32, 32).b, `tensor "t": n_dims 5 not in [1, 4]`},
		{"absurd n_dims", header(1, 0).str("t").u32(1 << 31).u64(0).u32(0).u64(0).b, "n_dims 2147483648"},
		{"zero dim", header(1, 0).tensor("t", quant.F32, 0, 8, 0).data(32, 32).b, `tensor "t": dimension 1 is zero`},
		{"dims overflow", header(1, 0).tensor("t", quant.F32, 0, 1<<32, 1<<32).data(32, 32).b, `tensor "t": dimensions [4294967296 4294967296] overflow`},
		{"dims overflow int64", header(1, 0).tensor("t", quant.I8, 0, 1<<62, 2).data(32, 32).b, "overflow the element count"},
		{"size overflow", header(1, 0).tensor("t", quant.F64, 0, 1<<61, 1).data(32, 32).b, "size of dimensions [2305843009213693952 1] of type F64 overflows"},
		{"unknown type", header(1, 0).tensor("blk.0.w", 99, 0, 8).data(32, 32).b, `tensor "blk.0.w": unknown tensor type 99`},
		{"row not multiple of block", header(1, 0).tensor("q", quant.Q8_0, 0, 48, 2).data(32, 128).b, `tensor "q": row length 48 is not a multiple of the Q8_0 block size 32`},
		{"row not multiple of K block", header(1, 0).tensor("k", quant.Q4_K, 0, 128).data(32, 144).b, "row length 128 is not a multiple of the Q4_K block size 256"},
		{"duplicate tensor", header(2, 0).tensor("t", quant.F32, 0, 8).tensor("t", quant.F32, 32, 8).data(32, 64).b, `duplicate tensor name "t" (tensors 0 and 1)`},
		{"misaligned offset", header(1, 0).tensor("t", quant.F32, 4, 4).data(32, 32).b, `tensor "t": offset 4 is not a multiple of the alignment 32`},
		{"out of file", header(1, 0).tensor("t", quant.F32, 0, 9).data(32, 32).b, `tensor "t": 36 bytes at offset 0 end past the 32-byte data section`},
		{"offset past end", header(1, 0).tensor("t", quant.F32, 1<<40, 1).data(32, 32).b, "end past the 32-byte data section"},
		{"offset wraps", header(1, 0).tensor("t", quant.F32, ^uint64(31), 8).data(32, 32).b, "end past the 32-byte data section"},
		{"no data section", header(1, 0).tensor("t", quant.F32, 0, 1).b, "data section at offset"},
		{"overlap", header(2, 0).tensor("a", quant.F32, 0, 16).tensor("b", quant.F32, 32, 8).data(32, 64).b, `tensors "a" [0, 64) and "b" [32, 64) overlap`},
		{"overlap out of order", header(2, 0).tensor("a", quant.F32, 32, 8).tensor("b", quant.F32, 0, 16).data(32, 64).b, `tensors "b" [0, 64) and "a" [32, 64) overlap`},
		{"same offset", header(2, 0).tensor("a", quant.F32, 0, 8).tensor("b", quant.F32, 0, 8).data(32, 64).b, "overlap"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := Parse(tc.file)
			if err == nil {
				t.Fatalf("Parse succeeded: %+v", f)
			}
			if !errors.Is(err, ErrFormat) {
				t.Errorf("error %v does not wrap ErrFormat", err)
			}
			if !strings.Contains(err.Error(), tc.sub) {
				t.Errorf("error %q does not contain %q", err, tc.sub)
			}
			if !strings.HasPrefix(err.Error(), "gguf: ") {
				t.Errorf("error %q lacks the gguf: prefix", err)
			}
		})
	}
}

// TestGoodOddFiles: valid files outside what Write produces parse: version
// 2, tensors stored out of index order with gaps, a file without tensors and
// without trailing padding, an array of arrays, a missing final padding.
func TestGoodOddFiles(t *testing.T) {
	v2 := (&raw{b: []byte("GGUF")}).u32(2).u64(1).u64(1).str("k").u32(uint32(TypeString)).str("v").
		tensor("t", quant.F32, 0, 8).data(32, 32).b
	f, err := Parse(v2)
	if err != nil || f.Version != 2 {
		t.Fatalf("version 2: %v", err)
	}
	if s, _ := f.String("k"); s != "v" {
		t.Errorf("version 2 value = %q", s)
	}

	gaps := header(2, 0).tensor("a", quant.F32, 128, 8).tensor("b", quant.Q8_0, 0, 32).data(32, 160).b
	f, err = Parse(gaps)
	if err != nil {
		t.Fatalf("gaps: %v", err)
	}
	if len(f.Data(&f.Tensors[0])) != 32 || len(f.Data(&f.Tensors[1])) != 34 {
		t.Error("gaps: wrong data lengths")
	}

	noPad := header(0, 1).str("k").u32(uint32(TypeUint8)).u8(1).b // 37 bytes, data section would be at 64
	f, err = Parse(noPad)
	if err != nil {
		t.Fatalf("no tensors, no padding: %v", err)
	}
	if f.DataOffset != 64 || f.Size != int64(len(noPad)) || f.Identity() == "" {
		t.Errorf("no padding: DataOffset %d Size %d", f.DataOffset, f.Size)
	}

	lastUnpadded := header(1, 0).tensor("t", quant.F32, 0, 3).data(32, 12).b
	if _, err := Parse(lastUnpadded); err != nil {
		t.Fatalf("unpadded last tensor: %v", err)
	}

	nested := header(0, 1).str("k").u32(uint32(TypeArray)).u32(uint32(TypeArray)).u64(2).
		u32(uint32(TypeInt32)).u64(1).u32(7).u32(uint32(TypeString)).u64(1).str("s").b
	f, err = Parse(nested)
	if err != nil {
		t.Fatalf("nested: %v", err)
	}
	v, _ := f.Get("k")
	if a, ok := v.([]any); !ok || len(a) != 2 || a[0].([]int32)[0] != 7 || a[1].([]string)[0] != "s" {
		t.Errorf("nested = %#v", v)
	}
}

// TestTruncated: every proper prefix of a valid file (whose last tensor
// ends exactly at the end of the file) fails with ErrFormat, never a panic.
func TestTruncated(t *testing.T) {
	kv := allKV()
	ts := testTensors()[:2]
	ts[1].Dims = []uint64{16} // F16 × 16 = 32 bytes: no trailing padding
	ts[1].Data = ts[1].Data[:0]
	ts[1].Data = make([]byte, 32)
	full := mustEncode(t, kv, ts)
	if _, err := Parse(full); err != nil {
		t.Fatal(err)
	}
	for n := range len(full) {
		f, err := Parse(full[:n])
		if err == nil {
			t.Fatalf("prefix of %d/%d bytes parsed: %+v", n, len(full), f)
		}
		if !errors.Is(err, ErrFormat) {
			t.Fatalf("prefix %d: %v does not wrap ErrFormat", n, err)
		}
	}
}
