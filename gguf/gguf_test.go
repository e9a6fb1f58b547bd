package gguf

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/cacheblend/cacheblend/quant"
)

// allKV has one entry of every scalar type, one array of every element type
// and an array of arrays.
func allKV() []KV {
	return []KV{
		{"general.architecture", "llama"},
		{"t.uint8", uint8(200)},
		{"t.int8", int8(-100)},
		{"t.uint16", uint16(60000)},
		{"t.int16", int16(-30000)},
		{"t.uint32", uint32(4000000000)},
		{"t.int32", int32(-2000000000)},
		{"t.float32", float32(1.5e-5)},
		{"t.bool", true},
		{"t.bool.false", false},
		{"t.string", "héllo, wörld"},
		{"t.string.empty", ""},
		{"t.uint64", uint64(math.MaxUint64)},
		{"t.int64", int64(math.MinInt64)},
		{"t.float64", math.Pi},
		{"a.uint8", []uint8{0, 1, 255}},
		{"a.int8", []int8{-128, 0, 127}},
		{"a.uint16", []uint16{0, 65535}},
		{"a.int16", []int16{-32768, 32767}},
		{"a.uint32", []uint32{0, 1, math.MaxUint32}},
		{"a.int32", []int32{-1, 0, 1, math.MaxInt32}},
		{"a.float32", []float32{0.25, -1, float32(math.Inf(1))}},
		{"a.bool", []bool{true, false, true}},
		{"a.string", []string{"a", "", "ĠĠ ĠĠ", "<|endoftext|>"}},
		{"a.uint64", []uint64{math.MaxUint64, 0}},
		{"a.int64", []int64{math.MinInt64, math.MaxInt64}},
		{"a.float64", []float64{math.SmallestNonzeroFloat64, -0.5}},
		{"a.empty", []float32{}},
		{"a.nested", []any{[]int32{1, 2}, []string{"x", "y"}, []any{}}[:2]},
	}
}

// randomBytes returns n deterministic pseudo-random bytes.
func randomBytes(seed uint64, n int) []byte {
	var key [32]byte
	key[0] = byte(seed)
	b := make([]byte, n)
	rand.NewChaCha8(key).Read(b)
	return b
}

// testTensors has one tensor of each of F32, F16, Q8_0 and Q4_K, with sizes
// that need padding between them.
func testTensors() []WriteTensor {
	mk := func(name string, typ quant.Type, dims ...uint64) WriteTensor {
		size, err := tensorSize(dims, typ)
		if err != nil {
			panic(err)
		}
		return WriteTensor{Name: name, Dims: dims, Type: typ, Data: randomBytes(uint64(len(name)), int(size))}
	}
	return []WriteTensor{
		mk("token_embd.weight", quant.F32, 3, 5),
		mk("blk.0.attn_norm.weight", quant.F16, 7),
		mk("blk.0.attn_q.weight", quant.Q8_0, 64, 3, 2),
		mk("output.weight", quant.Q4_K, 256, 2, 1, 1),
	}
}

func mustEncode(t testing.TB, kv []KV, ts []WriteTensor) []byte {
	t.Helper()
	b, err := Encode(kv, ts)
	if err != nil {
		t.Fatalf("Encode: %v", err)
	}
	return b
}

// checkFile compares a parsed file with what was written.
func checkFile(t *testing.T, f *File, kv []KV, ts []WriteTensor) {
	t.Helper()
	if f.Version != 3 {
		t.Errorf("Version = %d, want 3", f.Version)
	}
	if !reflect.DeepEqual(f.KV, kv) {
		for i := range kv {
			if i >= len(f.KV) || !reflect.DeepEqual(f.KV[i], kv[i]) {
				t.Fatalf("KV[%d]: got %#v, want %#v", i, f.KV[i], kv[i])
			}
		}
		t.Fatalf("KV: got %d entries, want %d", len(f.KV), len(kv))
	}
	for _, e := range kv {
		v, ok := f.Get(e.Key)
		if !ok || !reflect.DeepEqual(v, e.Value) {
			t.Errorf("Get(%q) = %#v, %v", e.Key, v, ok)
		}
	}
	if len(f.Tensors) != len(ts) {
		t.Fatalf("%d tensors, want %d", len(f.Tensors), len(ts))
	}
	for i, w := range ts {
		ti := &f.Tensors[i]
		if ti.Name != w.Name || !reflect.DeepEqual(ti.Dims, w.Dims) || ti.Type != w.Type || ti.Size != int64(len(w.Data)) {
			t.Errorf("tensor %d = %+v, want %s %v %v size %d", i, *ti, w.Name, w.Dims, w.Type, len(w.Data))
		}
		if ti.Offset%uint64(f.Alignment) != 0 {
			t.Errorf("tensor %q offset %d not aligned to %d", w.Name, ti.Offset, f.Alignment)
		}
		got, ok := f.Tensor(w.Name)
		if !ok || got != ti {
			t.Errorf("Tensor(%q) = %p, %v; want %p", w.Name, got, ok, ti)
		}
		if d := f.Data(ti); !bytes.Equal(d, w.Data) {
			t.Errorf("Data(%q): %d bytes differ from the %d written", w.Name, len(d), len(w.Data))
		}
	}
	if _, ok := f.Tensor("nope"); ok {
		t.Error("Tensor(nope) found")
	}
	if f.DataOffset%int64(f.Alignment) != 0 {
		t.Errorf("DataOffset %d not aligned", f.DataOffset)
	}
}

// TestRoundTripParse writes every value type and the tensor types F32, F16,
// Q8_0 and Q4_K, with the default and a custom alignment, and parses them
// back unchanged; Write and Encode produce the same bytes.
func TestRoundTripParse(t *testing.T) {
	for _, tc := range []struct {
		name  string
		align uint32 // 0: no general.alignment key
	}{
		{"default alignment", 0},
		{"alignment 1", 1},
		{"alignment 64", 64},
		{"alignment 65536", 65536},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kv := allKV()
			want := DefaultAlignment
			if tc.align != 0 {
				kv = append(kv, KV{KeyAlignment, tc.align})
				want = int(tc.align)
			}
			ts := testTensors()
			enc := mustEncode(t, kv, ts)
			var buf bytes.Buffer
			if err := Write(&buf, kv, ts); err != nil {
				t.Fatalf("Write: %v", err)
			}
			if !bytes.Equal(buf.Bytes(), enc) {
				t.Fatal("Write and Encode differ")
			}
			f, err := Parse(enc)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if f.Alignment != want {
				t.Errorf("Alignment = %d, want %d", f.Alignment, want)
			}
			checkFile(t, f, kv, ts)
			if f.Architecture() != "llama" {
				t.Errorf("Architecture = %q", f.Architecture())
			}
			if err := f.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
	}
}

// TestRoundTripOpen writes a file to disk and opens it back, mapped and
// resident; the identity equals that of Parse on the same bytes, and Close
// is idempotent.
func TestRoundTripOpen(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []OpenOption
	}{
		{"mapped", nil},
		{"resident", []OpenOption{Resident()}},
	} {
		t.Run(tc.name, func(t *testing.T) { testRoundTripOpen(t, tc.opts...) })
	}
}

func testRoundTripOpen(t *testing.T, opts ...OpenOption) {
	kv, ts := allKV(), testTensors()
	path := filepath.Join(t.TempDir(), "m.gguf")
	w, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := Write(w, kv, ts); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path, opts...)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	checkFile(t, f, kv, ts)
	st, _ := os.Stat(path)
	if f.Size != st.Size() {
		t.Errorf("Size = %d, want %d", f.Size, st.Size())
	}
	raw, _ := os.ReadFile(path)
	p, err := Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	id := f.Identity()
	if id != p.Identity() {
		t.Errorf("Open identity %s != Parse identity %s", id, p.Identity())
	}
	if err := f.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if f.Identity() != id {
		t.Error("identity changed after Close")
	}
	if d := f.Data(&f.Tensors[0]); d != nil {
		t.Error("Data after Close is not nil")
	}
}

// TestIdentity: the identity has the documented form, changes with the
// metadata, and ignores the tensor data (which it must not hash).
func TestIdentity(t *testing.T) {
	kv, ts := allKV(), testTensors()
	a := mustEncode(t, kv, ts)
	fa, err := Parse(a)
	if err != nil {
		t.Fatal(err)
	}
	id := fa.Identity()
	if !strings.HasPrefix(id, "gguf-") || id != "gguf-"+strconv.Itoa(len(a))+"-"+id[len(id)-64:] || len(id) != len("gguf-")+len(strconv.Itoa(len(a)))+1+64 {
		t.Fatalf("identity %q has the wrong form", id)
	}
	ts2 := testTensors()
	ts2[0].Data[0] ^= 0xff
	fb, _ := Parse(mustEncode(t, kv, ts2))
	if fb.Identity() != id {
		t.Error("identity depends on tensor data")
	}
	kv2 := allKV()
	kv2[0].Value = "qwen2"
	fc, _ := Parse(mustEncode(t, kv2, ts))
	if fc.Identity() == id {
		t.Error("identity ignores metadata")
	}
}

// TestAccessors checks the typed getters' conversions and their errors.
func TestAccessors(t *testing.T) {
	f, err := Parse(mustEncode(t, append(allKV(),
		KV{"n.neg", int32(-5)}, KV{"n.i64", int64(7)}, KV{"a.u32.big", []uint32{1, math.MaxUint32}},
		KV{"a.i64", []int64{-3, 4}}, KV{"n.bigu64", uint64(math.MaxInt64) + 1}), nil))
	if err != nil {
		t.Fatal(err)
	}
	ok := func(name string, got, want any, err error) {
		t.Helper()
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("%s = %#v, %v; want %#v", name, got, err, want)
		}
	}
	s, err := f.String("t.string")
	ok("String", s, "héllo, wörld", err)
	u, err := f.Uint("t.uint8")
	ok("Uint(uint8)", u, uint64(200), err)
	u, err = f.Uint("n.i64")
	ok("Uint(int64)", u, uint64(7), err)
	u, err = f.Uint("t.uint64")
	ok("Uint(uint64)", u, uint64(math.MaxUint64), err)
	i, err := f.Int("t.int32")
	ok("Int(int32)", i, int64(-2000000000), err)
	i, err = f.Int("t.uint32")
	ok("Int(uint32)", i, int64(4000000000), err)
	x, err := f.Float("t.float32")
	ok("Float(float32)", x, float64(float32(1.5e-5)), err)
	x, err = f.Float("t.float64")
	ok("Float(float64)", x, math.Pi, err)
	x, err = f.Float("t.int16")
	ok("Float(int16)", x, float64(-30000), err)
	bv, err := f.Bool("t.bool")
	ok("Bool", bv, true, err)
	ss, err := f.Strings("a.string")
	ok("Strings", ss, []string{"a", "", "ĠĠ ĠĠ", "<|endoftext|>"}, err)
	fs, err := f.Float32s("a.float32")
	ok("Float32s", fs, []float32{0.25, -1, float32(math.Inf(1))}, err)
	fs, err = f.Float32s("a.float64")
	ok("Float32s(float64)", fs, []float32{float32(math.SmallestNonzeroFloat64), -0.5}, err)
	is, err := f.Int32s("a.int32")
	ok("Int32s", is, []int32{-1, 0, 1, math.MaxInt32}, err)
	is, err = f.Int32s("a.int8")
	ok("Int32s(int8)", is, []int32{-128, 0, 127}, err)
	is, err = f.Int32s("a.i64")
	ok("Int32s(int64)", is, []int32{-3, 4}, err)

	for _, tc := range []struct {
		name string
		call func() error
		want error
		sub  string
	}{
		{"String missing", func() error { _, err := f.String("no.such"); return err }, ErrMissingKey, `"no.such"`},
		{"String wrong", func() error { _, err := f.String("t.uint8"); return err }, ErrWrongType, `"t.uint8" is uint8, want string`},
		{"Uint negative", func() error { _, err := f.Uint("n.neg"); return err }, ErrWrongType, "negative"},
		{"Uint float", func() error { _, err := f.Uint("t.float32"); return err }, ErrWrongType, "t.float32"},
		{"Uint missing", func() error { _, err := f.Uint("x"); return err }, ErrMissingKey, `"x"`},
		{"Int overflow", func() error { _, err := f.Int("n.bigu64"); return err }, ErrWrongType, "overflows int64"},
		{"Int string", func() error { _, err := f.Int("t.string"); return err }, ErrWrongType, "want an integer"},
		{"Float bool", func() error { _, err := f.Float("t.bool"); return err }, ErrWrongType, "t.bool"},
		{"Bool int", func() error { _, err := f.Bool("t.int8"); return err }, ErrWrongType, "t.int8"},
		{"Strings ints", func() error { _, err := f.Strings("a.int32"); return err }, ErrWrongType, "a.int32"},
		{"Float32s ints", func() error { _, err := f.Float32s("a.int32"); return err }, ErrWrongType, "a.int32"},
		{"Int32s out of range", func() error { _, err := f.Int32s("a.u32.big"); return err }, ErrWrongType, "element 1"},
		{"Int32s strings", func() error { _, err := f.Int32s("a.string"); return err }, ErrWrongType, "a.string"},
		{"Int32s missing", func() error { _, err := f.Int32s("gone"); return err }, ErrMissingKey, "gone"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.sub) {
				t.Errorf("err = %v, want %v containing %q", err, tc.want, tc.sub)
			}
		})
	}
	if _, ok := f.Get("absent"); ok {
		t.Error("Get(absent) found")
	}
	g, _ := Parse(mustEncode(t, []KV{{"general.architecture", uint32(1)}}, nil))
	if g.Architecture() != "" {
		t.Errorf("Architecture of a non-string = %q", g.Architecture())
	}
}

// TestEncodeErrors: invalid writer input fails with an error naming it.
func TestEncodeErrors(t *testing.T) {
	good := testTensors()
	for _, tc := range []struct {
		name string
		kv   []KV
		ts   []WriteTensor
		sub  string
	}{
		{"empty key", []KV{{"", uint8(1)}}, nil, "empty metadata key"},
		{"duplicate key", []KV{{"a", uint8(1)}, {"a", uint8(2)}}, nil, `duplicate metadata key "a"`},
		{"unsupported type", []KV{{"k", 3}}, nil, `key "k": unsupported value type int`},
		{"unsupported array", []KV{{"k", []int{1}}}, nil, "unsupported value type []int"},
		{"nested too deep", []KV{{"k", []any{[]any{[]int32{1}}}}}, nil, "nested deeper than 2"},
		{"empty nested too deep", []KV{{"k", []any{[]any{}}}}, nil, "nested deeper than 2"},
		{"non-array element", []KV{{"k", []any{int32(1)}}}, nil, "element 0"},
		{"alignment type", []KV{{KeyAlignment, uint64(32)}}, nil, "must be uint32"},
		{"alignment not power of two", []KV{{KeyAlignment, uint32(48)}}, nil, "alignment 48"},
		{"alignment too big", []KV{{KeyAlignment, uint32(1 << 17)}}, nil, "alignment 131072"},
		{"no name", nil, []WriteTensor{{Dims: []uint64{1}, Type: quant.F32, Data: make([]byte, 4)}}, "tensor 0 has no name"},
		{"long name", nil, []WriteTensor{{Name: strings.Repeat("n", 64), Dims: []uint64{1}, Type: quant.F32, Data: make([]byte, 4)}}, "longer than 63"},
		{"duplicate tensor", nil, []WriteTensor{good[0], good[0]}, "duplicate tensor name"},
		{"no dims", nil, []WriteTensor{{Name: "t", Type: quant.F32}}, "n_dims 0"},
		{"five dims", nil, []WriteTensor{{Name: "t", Dims: []uint64{1, 1, 1, 1, 1}, Type: quant.F32, Data: make([]byte, 4)}}, "n_dims 5"},
		{"zero dim", nil, []WriteTensor{{Name: "t", Dims: []uint64{4, 0}, Type: quant.F32}}, "dimension 1 is zero"},
		{"unknown type", nil, []WriteTensor{{Name: "t", Dims: []uint64{1}, Type: 99, Data: make([]byte, 4)}}, "unknown tensor type 99"},
		{"row not multiple", nil, []WriteTensor{{Name: "t", Dims: []uint64{33}, Type: quant.Q8_0}}, "row length 33 is not a multiple of the Q8_0 block size 32"},
		{"wrong data length", nil, []WriteTensor{{Name: "t", Dims: []uint64{2}, Type: quant.F32, Data: make([]byte, 7)}}, "data is 7 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Encode(tc.kv, tc.ts)
			if err == nil || !strings.Contains(err.Error(), tc.sub) {
				t.Fatalf("Encode err = %v, want it to contain %q", err, tc.sub)
			}
			var buf bytes.Buffer
			if err := Write(&buf, tc.kv, tc.ts); err == nil || buf.Len() != 0 {
				t.Fatalf("Write err = %v after writing %d bytes", err, buf.Len())
			}
		})
	}
}

// TestWriteError: an io.Writer failure is returned.
func TestWriteError(t *testing.T) {
	err := Write(failWriter{}, allKV(), testTensors())
	if err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("err = %v", err)
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

// TestOpenErrors: missing, empty, directory and malformed files fail
// cleanly; a parse failure names the path and wraps ErrFormat.
func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.gguf")
	bad := filepath.Join(dir, "bad.gguf")
	os.WriteFile(empty, nil, 0o644)
	os.WriteFile(bad, []byte("GGML\x03\x00\x00\x00"), 0o644)
	for _, tc := range []struct {
		name, path, sub string
		format          bool
	}{
		{"missing", filepath.Join(dir, "none.gguf"), "no such file", false},
		{"empty", empty, "empty file", true},
		{"directory", dir, "not a regular file", false},
		{"bad magic", bad, bad + `: bad magic "GGML"`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, opts := range [][]OpenOption{nil, {Resident()}} {
				f, err := Open(tc.path, opts...)
				if err == nil || f != nil || !strings.Contains(err.Error(), tc.sub) || errors.Is(err, ErrFormat) != tc.format {
					t.Fatalf("Open (%d options) = %v, %v; want error containing %q (ErrFormat %v)", len(opts), f, err, tc.sub, tc.format)
				}
			}
		})
	}
}

// TestOpenNoCopy: opening a file with 32 MiB of tensor data allocates far
// less than that on the Go heap (the data is mapped, not read; resident,
// it is read into memory outside the heap), and Data reads the bytes.
func TestOpenNoCopy(t *testing.T) {
	data := randomBytes(7, 32<<20)
	path := filepath.Join(t.TempDir(), "big.gguf")
	w, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := Write(w, []KV{{KeyArchitecture, "llama"}}, []WriteTensor{{Name: "w", Dims: []uint64{1024, 8192}, Type: quant.F32, Data: data}}); err != nil {
		t.Fatal(err)
	}
	w.Close()
	for _, opts := range [][]OpenOption{nil, {Resident()}} {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		f, err := Open(path, opts...)
		if err != nil {
			t.Fatal(err)
		}
		runtime.ReadMemStats(&after)
		if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
			t.Errorf("Open (%d options) allocated %d bytes for a %d-byte file", len(opts), n, f.Size)
		}
		if !bytes.Equal(f.Data(&f.Tensors[0]), data) {
			t.Errorf("Open (%d options): tensor data differs", len(opts))
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestInt32sRange checks the int32 range of Int32s at the edges of every
// wider array type.
func TestInt32sRange(t *testing.T) {
	for _, tc := range []struct {
		name string
		v    any
		ok   bool
	}{
		{"uint32 max int32", []uint32{math.MaxInt32}, true},
		{"uint32 past int32", []uint32{math.MaxInt32 + 1}, false},
		{"uint32 max", []uint32{math.MaxUint32}, false},
		{"int64 min int32", []int64{math.MinInt32}, true},
		{"int64 below int32", []int64{math.MinInt32 - 1}, false},
		{"int64 past int32", []int64{math.MaxInt32 + 1}, false},
		{"uint64 max int32", []uint64{math.MaxInt32}, true},
		{"uint64 max", []uint64{math.MaxUint64}, false},
		{"uint64 2^32-1", []uint64{math.MaxUint32}, false},
		{"int8 min", []int8{math.MinInt8}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data, err := Encode([]KV{{Key: "k", Value: tc.v}}, nil)
			if err != nil {
				t.Fatal(err)
			}
			f, err := Parse(data)
			if err != nil {
				t.Fatal(err)
			}
			got, err := f.Int32s("k")
			if tc.ok {
				want := int64(reflect.ValueOf(tc.v).Index(0).Convert(reflect.TypeFor[int64]()).Int())
				if err != nil || len(got) != 1 || int64(got[0]) != want {
					t.Errorf("Int32s = %v, %v; want [%d]", got, err, want)
				}
			} else if !errors.Is(err, ErrWrongType) || !strings.Contains(err.Error(), "element 0") {
				t.Errorf("Int32s = %v, %v; want an ErrWrongType naming element 0", got, err)
			}
		})
	}
}

// TestRelease drops metadata entries: they are missing afterwards, the
// others (before and after them in file order) still found, the identity
// unchanged, and absent keys ignored.
func TestRelease(t *testing.T) {
	f, err := Parse(mustEncode(t, []KV{{"a", uint32(1)}, {"big", []string{"x", "y"}}, {"b", "kept"}, {"c", []int32{3}}}, nil))
	if err != nil {
		t.Fatal(err)
	}
	id := f.Identity()
	f.Release("big", "c", "absent")
	if _, ok := f.Get("big"); ok {
		t.Fatal("released key still found")
	}
	if _, err := f.Strings("big"); !errors.Is(err, ErrMissingKey) {
		t.Fatalf("Strings of a released key: %v", err)
	}
	if v, err := f.Uint("a"); err != nil || v != 1 {
		t.Fatalf("a = %v, %v", v, err)
	}
	if s, err := f.String("b"); err != nil || s != "kept" {
		t.Fatalf("b = %q, %v", s, err)
	}
	if len(f.KV) != 2 || f.KV[0].Key != "a" || f.KV[1].Key != "b" || f.Identity() != id {
		t.Fatalf("metadata %v, identity %s (was %s)", f.KV, f.Identity(), id)
	}
}
