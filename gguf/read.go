package gguf

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"reflect"
	"slices"
	"unsafe"

	"github.com/cacheblend/cacheblend/quant"
)

var magic = [4]byte{'G', 'G', 'U', 'F'}

// minKVSize is the smallest encoded metadata entry: an 8-byte key length,
// a 4-byte value type and a 1-byte value.
const minKVSize = 8 + 4 + 1

// minTensorInfoSize is the smallest encoded tensor index entry: an 8-byte
// name length, 4-byte n_dims, one 8-byte dim, a 4-byte type and an 8-byte
// offset.
const minTensorInfoSize = 8 + 4 + 8 + 4 + 8

// Parse parses a GGUF file held in data and validates it (see the package
// documentation for the checks). The returned File aliases data: its
// [File.Data] slices point into it, so data must not be modified while the
// File is in use. [File.Close] on a parsed File does nothing.
func Parse(data []byte) (*File, error) {
	return parse(data, "")
}

// decoder reads little-endian values from b, bounds-checked.
type decoder struct {
	b      []byte
	off    int
	prefix string // error prefix ("path: ")
}

func (d *decoder) remain() int { return len(d.b) - d.off }

func (d *decoder) errorf(format string, args ...any) error {
	return formatError(d.prefix, format, args...)
}

// take returns the next n bytes, or an error naming what was being read.
func (d *decoder) take(n int, what string) ([]byte, error) {
	if n < 0 || n > d.remain() {
		return nil, d.errorf("%s: truncated at offset %d (need %d bytes, %d remain)", what, d.off, n, d.remain())
	}
	p := d.b[d.off : d.off+n]
	d.off += n
	return p, nil
}

func (d *decoder) u32(what string) (uint32, error) {
	p, err := d.take(4, what)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(p), nil
}

func (d *decoder) u64(what string) (uint64, error) {
	p, err := d.take(8, what)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(p), nil
}

// str reads a GGUF string (uint64 length + bytes); the length is checked
// against the bytes remaining before anything is allocated.
func (d *decoder) str(what string) (string, error) {
	n, err := d.u64(what + " length")
	if err != nil {
		return "", err
	}
	if n > uint64(d.remain()) {
		return "", d.errorf("%s: string length %d exceeds the %d bytes remaining", what, n, d.remain())
	}
	p, _ := d.take(int(n), what)
	return string(p), nil
}

func parse(data []byte, prefix string) (*File, error) {
	d := &decoder{b: data, prefix: prefix}
	f := &File{data: data, Size: int64(len(data)), Alignment: DefaultAlignment}

	// Header.
	m, err := d.take(4, "magic")
	if err != nil {
		return nil, err
	}
	if [4]byte(m) != magic {
		return nil, d.errorf("bad magic %q, want \"GGUF\"", m)
	}
	if f.Version, err = d.u32("version"); err != nil {
		return nil, err
	}
	switch {
	case f.Version == 1:
		return nil, d.errorf("GGUF version 1 is not supported (only 2 and 3)")
	case f.Version > 0xffff && bits.ReverseBytes32(f.Version) <= 3:
		return nil, d.errorf("version %d: a big-endian file is not supported", f.Version)
	case f.Version != 2 && f.Version != 3:
		return nil, d.errorf("unsupported version %d (only 2 and 3)", f.Version)
	}
	nTensors, err := d.u64("tensor count")
	if err != nil {
		return nil, err
	}
	nKV, err := d.u64("metadata count")
	if err != nil {
		return nil, err
	}
	if nKV > uint64(d.remain()/minKVSize) {
		return nil, d.errorf("metadata count %d exceeds what the %d bytes remaining can hold", nKV, d.remain())
	}
	if nTensors > uint64(d.remain()/minTensorInfoSize) {
		return nil, d.errorf("tensor count %d exceeds what the %d bytes remaining can hold", nTensors, d.remain())
	}

	if err := d.metadata(f, nKV); err != nil {
		return nil, err
	}

	// Tensor index.
	if nTensors > uint64(d.remain()/minTensorInfoSize) {
		return nil, d.errorf("tensor count %d exceeds what the %d bytes remaining can hold", nTensors, d.remain())
	}
	f.Tensors = make([]TensorInfo, nTensors)
	f.tIndex = make(map[string]int, nTensors)
	for i := range nTensors {
		ti := &f.Tensors[i]
		if err := d.tensorInfo(ti, i); err != nil {
			return nil, err
		}
		if j, dup := f.tIndex[ti.Name]; dup {
			return nil, d.errorf("duplicate tensor name %q (tensors %d and %d)", ti.Name, j, i)
		}
		f.tIndex[ti.Name] = int(i)
	}

	// Data section.
	f.DataOffset = alignUp(int64(d.off), int64(f.Alignment))
	if err := f.checkLayout(d); err != nil {
		return nil, err
	}
	return f, nil
}

// metadata reads the n metadata entries into f and validates
// general.alignment.
func (d *decoder) metadata(f *File, n uint64) error {
	f.KV = make([]KV, 0, n)
	f.kvIndex = make(map[string]int, n)
	for i := range n {
		key, err := d.str(fmt.Sprintf("metadata key %d", i))
		if err != nil {
			return err
		}
		if key == "" {
			return d.errorf("metadata key %d is empty", i)
		}
		if _, dup := f.kvIndex[key]; dup {
			return d.errorf("duplicate metadata key %q", key)
		}
		what := fmt.Sprintf("key %q", key)
		t, err := d.u32(what + " value type")
		if err != nil {
			return err
		}
		v, err := d.value(ValueType(t), 0, what)
		if err != nil {
			return err
		}
		f.kvIndex[key] = len(f.KV)
		f.KV = append(f.KV, KV{Key: key, Value: v})
	}
	if v, ok := f.Get(KeyAlignment); ok {
		a, isU32 := v.(uint32)
		if !isU32 {
			return d.errorf("key %q must be uint32, is %s", KeyAlignment, goTypeName(v))
		}
		if a == 0 || a > MaxAlignment || a&(a-1) != 0 {
			return d.errorf("alignment %d is not a power of two in [1, %d]", a, MaxAlignment)
		}
		f.Alignment = int(a)
	}
	return nil
}

// tensorInfo reads and validates index entry i into ti (all but the layout
// checks, which need the whole index).
func (d *decoder) tensorInfo(ti *TensorInfo, i uint64) error {
	name, err := d.str(fmt.Sprintf("tensor %d name", i))
	if err != nil {
		return err
	}
	if name == "" {
		return d.errorf("tensor %d has an empty name", i)
	}
	if len(name) > MaxNameLen {
		return d.errorf("tensor %d: name of %d bytes is longer than %d", i, len(name), MaxNameLen)
	}
	ti.Name = name
	what := fmt.Sprintf("tensor %q", name)
	nDims, err := d.u32(what + " n_dims")
	if err != nil {
		return err
	}
	if nDims < 1 || nDims > MaxDims {
		return d.errorf("%s: n_dims %d not in [1, %d]", what, nDims, MaxDims)
	}
	ti.Dims = make([]uint64, nDims)
	for j := range ti.Dims {
		if ti.Dims[j], err = d.u64(what + " dims"); err != nil {
			return err
		}
	}
	t, err := d.u32(what + " type")
	if err != nil {
		return err
	}
	ti.Type = quant.Type(t)
	if ti.Offset, err = d.u64(what + " offset"); err != nil {
		return err
	}
	if ti.Size, err = tensorSize(ti.Dims, ti.Type); err != nil {
		return d.errorf("%s: %v", what, err)
	}
	return nil
}

// checkLayout checks the tensors' offsets: aligned, inside the file and not
// overlapping.
func (f *File) checkLayout(d *decoder) error {
	if len(f.Tensors) == 0 {
		return nil
	}
	if f.DataOffset > f.Size {
		return d.errorf("data section at offset %d starts past the end of the %d-byte file", f.DataOffset, f.Size)
	}
	room := uint64(f.Size - f.DataOffset)
	order := make([]int, len(f.Tensors))
	for i := range order {
		order[i] = i
		t := &f.Tensors[i]
		if t.Offset%uint64(f.Alignment) != 0 {
			return d.errorf("tensor %q: offset %d is not a multiple of the alignment %d", t.Name, t.Offset, f.Alignment)
		}
		if t.Offset > room || uint64(t.Size) > room-t.Offset {
			return d.errorf("tensor %q: %d bytes at offset %d end past the %d-byte data section", t.Name, t.Size, t.Offset, room)
		}
	}
	slices.SortFunc(order, func(a, b int) int {
		return cmp.Or(cmp.Compare(f.Tensors[a].Offset, f.Tensors[b].Offset), a-b)
	})
	for k := 1; k < len(order); k++ {
		p, q := &f.Tensors[order[k-1]], &f.Tensors[order[k]]
		if p.Offset+uint64(p.Size) > q.Offset {
			return d.errorf("tensors %q [%d, %d) and %q [%d, %d) overlap", p.Name, p.Offset, p.Offset+uint64(p.Size), q.Name, q.Offset, q.Offset+uint64(q.Size))
		}
	}
	return nil
}

// tensorSize validates dims and typ and returns the tensor's byte size.
func tensorSize(dims []uint64, typ quant.Type) (int64, error) {
	if len(dims) < 1 || len(dims) > MaxDims {
		return 0, fmt.Errorf("n_dims %d not in [1, %d]", len(dims), MaxDims)
	}
	n := uint64(1)
	for j, v := range dims {
		if v == 0 {
			return 0, fmt.Errorf("dimension %d is zero", j)
		}
		hi, lo := bits.Mul64(n, v)
		if hi != 0 || lo > math.MaxInt64 {
			return 0, fmt.Errorf("dimensions %v overflow the element count", dims)
		}
		n = lo
	}
	if !typ.Known() {
		return 0, fmt.Errorf("unknown tensor type %d", uint32(typ))
	}
	bs, ts := uint64(typ.BlockSize()), uint64(typ.TypeSize())
	if dims[0]%bs != 0 {
		return 0, fmt.Errorf("row length %d is not a multiple of the %v block size %d", dims[0], typ, bs)
	}
	hi, size := bits.Mul64(n/bs, ts)
	if hi != 0 || size > math.MaxInt64 {
		return 0, fmt.Errorf("size of dimensions %v of type %v overflows", dims, typ)
	}
	return int64(size), nil
}

// alignUp rounds n up to a multiple of the power of two a.
func alignUp(n, a int64) int64 { return (n + a - 1) &^ (a - 1) }

// value reads one value of type t; depth is the nesting depth of arrays
// around it (0 at the top level).
func (d *decoder) value(t ValueType, depth int, what string) (any, error) {
	if t == TypeString {
		return d.str(what)
	}
	if t == TypeArray {
		if depth >= MaxArrayDepth {
			return nil, d.errorf("%s: arrays nested deeper than %d", what, MaxArrayDepth)
		}
		return d.array(depth+1, what)
	}
	n := t.fixedSize()
	if n == 0 {
		return nil, d.errorf("%s: unknown value type %d", what, uint32(t))
	}
	p, err := d.take(n, what)
	if err != nil {
		return nil, err
	}
	le := binary.LittleEndian
	switch t {
	case TypeUint8:
		return p[0], nil
	case TypeInt8:
		return int8(p[0]), nil
	case TypeBool:
		if p[0] > 1 {
			return nil, d.errorf("%s: bool byte %d is not 0 or 1", what, p[0])
		}
		return p[0] == 1, nil
	case TypeUint16:
		return le.Uint16(p), nil
	case TypeInt16:
		return int16(le.Uint16(p)), nil
	case TypeUint32:
		return le.Uint32(p), nil
	case TypeInt32:
		return int32(le.Uint32(p)), nil
	case TypeFloat32:
		return math.Float32frombits(le.Uint32(p)), nil
	case TypeUint64:
		return le.Uint64(p), nil
	case TypeInt64:
		return int64(le.Uint64(p)), nil
	default: // TypeFloat64
		return math.Float64frombits(le.Uint64(p)), nil
	}
}

// array reads an array (element type, count, elements) at nesting depth
// depth (1 for a top-level array).
func (d *decoder) array(depth int, what string) (any, error) {
	et, err := d.u32(what + " array type")
	if err != nil {
		return nil, err
	}
	n64, err := d.u64(what + " array count")
	if err != nil {
		return nil, err
	}
	t := ValueType(et)
	minSize := t.minSize()
	if minSize == 0 {
		return nil, d.errorf("%s: array of unknown value type %d", what, et)
	}
	if t == TypeArray && depth >= MaxArrayDepth {
		return nil, d.errorf("%s: arrays nested deeper than %d", what, MaxArrayDepth)
	}
	if n64 > uint64(d.remain()/minSize) {
		return nil, d.errorf("%s: array count %d of %s exceeds what the %d bytes remaining can hold", what, n64, t, d.remain())
	}
	n := int(n64)
	switch t {
	case TypeString:
		return d.strings(n, what)
	case TypeArray:
		out := make([]any, n)
		for i := range out {
			if out[i], err = d.array(depth+1, what); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	p, _ := d.take(n*minSize, what) // checked above
	if t == TypeBool {
		for i, b := range p {
			if b > 1 {
				return nil, d.errorf("%s: element %d: bool byte %d is not 0 or 1", what, i, b)
			}
		}
	}
	out := reflect.MakeSlice(reflect.SliceOf(goTypes[t]), n, n).Interface()
	if _, err := binary.Decode(p, binary.LittleEndian, out); err != nil {
		return nil, d.errorf("%s: %v", what, err)
	}
	return out, nil
}

// strings reads n strings with one allocation for their bytes: a first pass
// validates the lengths, then the strings' bytes (without their length
// prefixes: 8 bytes a string, 2.4 MB of a 151,936-token vocabulary and its
// merges) are copied into one buffer that the elements share.
func (d *decoder) strings(n int, what string) ([]string, error) {
	start := d.off
	off := d.off
	total := 0
	for i := range n {
		if len(d.b)-off < 8 {
			d.off = off
			return nil, d.errorf("%s: element %d length: truncated at offset %d", what, i, off)
		}
		l := binary.LittleEndian.Uint64(d.b[off:])
		off += 8
		if l > uint64(len(d.b)-off) {
			d.off = off
			return nil, d.errorf("%s: element %d: string length %d exceeds the %d bytes remaining", what, i, l, len(d.b)-off)
		}
		off += int(l)
		total += int(l)
	}
	buf := make([]byte, 0, total)
	out := make([]string, n)
	pos := start
	for i := range out {
		l := int(binary.LittleEndian.Uint64(d.b[pos:]))
		pos += 8
		b0 := len(buf)
		buf = append(buf, d.b[pos:pos+l]...)
		pos += l
		// buf never grows past its capacity and is never written again,
		// so the strings over it are immutable.
		out[i] = unsafe.String(unsafe.SliceData(buf[b0:]), l)
	}
	d.off = off
	return out, nil
}

// goTypeName names the GGUF type of a decoded value for error messages.
func goTypeName(v any) string {
	if t, ok := valueTypeOf(v); ok {
		if t == TypeArray {
			return fmt.Sprintf("%T", v)
		}
		return t.String()
	}
	return fmt.Sprintf("%T", v)
}
