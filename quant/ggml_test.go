package quant

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// The cross-check against ggml itself: a small C program (harnessC, our
// own code) is compiled with gcc together with llama.cpp's
// ggml/src/ggml-quants.c from the reference checkout (CB_REF_DIR, made by
// scripts/deps.sh; nothing of llama.cpp is copied into this repository),
// and fed records on stdin:
//
//	op uint8, type uint32, n uint32, payload
//
// op 'D' dequantizes a row (payload: its bytes) to n floats with ggml's
// dequantize_row_*; 'Q' quantizes n floats with quantize_row_*_ref to the
// row's bytes; 'H' converts n halves to floats and 'h' n floats to halves
// with ggml's software conversions, 'b' n floats to bf16. Replies go to
// stdout in order. It is built with -ffp-contract=off, as the Go ports
// round every product.
const harnessC = `
#include "ggml.h"
#include "ggml-impl.h"
#include "ggml-quants.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdarg.h>

void ggml_abort(const char * file, int line, const char * fmt, ...) {
	fprintf(stderr, "ggml_abort %s:%d\n", file, line); abort();
}
size_t ggml_row_size(enum ggml_type type, int64_t ne) { (void)type; (void)ne; abort(); }
size_t ggml_type_size(enum ggml_type type) { (void)type; abort(); }
const char * ggml_type_name(enum ggml_type type) { (void)type; return "?"; }

static void rd(void * p, size_t n) { if (fread(p, 1, n, stdin) != n) exit(n ? 3 : 0); }
static void wr(const void * p, size_t n) { if (fwrite(p, 1, n, stdout) != n) exit(4); }

static size_t rowbytes(uint32_t t, uint32_t n) {
	switch (t) {
	case GGML_TYPE_F32: return 4*n;
	case GGML_TYPE_F16: case GGML_TYPE_BF16: return 2*n;
	case GGML_TYPE_Q4_0: return n/32*sizeof(block_q4_0);
	case GGML_TYPE_Q4_1: return n/32*sizeof(block_q4_1);
	case GGML_TYPE_Q5_0: return n/32*sizeof(block_q5_0);
	case GGML_TYPE_Q5_1: return n/32*sizeof(block_q5_1);
	case GGML_TYPE_Q8_0: return n/32*sizeof(block_q8_0);
	case GGML_TYPE_Q4_K: return n/256*sizeof(block_q4_K);
	case GGML_TYPE_Q5_K: return n/256*sizeof(block_q5_K);
	case GGML_TYPE_Q6_K: return n/256*sizeof(block_q6_K);
	}
	fprintf(stderr, "type %u\n", t); exit(5);
}

int main(void) {
	for (;;) {
		uint8_t op; uint32_t t, n;
		if (fread(&op, 1, 1, stdin) != 1) return 0;
		rd(&t, 4); rd(&n, 4);
		size_t rb = rowbytes(t, n);
		uint8_t * q = malloc(rb + 1);
		float * f = malloc(4*(size_t)n + 4);
		uint16_t * h = malloc(2*(size_t)n + 2);
		switch (op) {
		case 'D':
			rd(q, rb);
			switch (t) {
			case GGML_TYPE_F32: memcpy(f, q, rb); break;
			case GGML_TYPE_F16: for (uint32_t i = 0; i < n; i++) { uint16_t v; memcpy(&v, q+2*i, 2); f[i] = ggml_compute_fp16_to_fp32(v); } break;
			case GGML_TYPE_BF16: for (uint32_t i = 0; i < n; i++) { ggml_bf16_t v; memcpy(&v.bits, q+2*i, 2); f[i] = ggml_compute_bf16_to_fp32(v); } break;
			case GGML_TYPE_Q4_0: dequantize_row_q4_0((void*)q, f, n); break;
			case GGML_TYPE_Q4_1: dequantize_row_q4_1((void*)q, f, n); break;
			case GGML_TYPE_Q5_0: dequantize_row_q5_0((void*)q, f, n); break;
			case GGML_TYPE_Q5_1: dequantize_row_q5_1((void*)q, f, n); break;
			case GGML_TYPE_Q8_0: dequantize_row_q8_0((void*)q, f, n); break;
			case GGML_TYPE_Q4_K: dequantize_row_q4_K((void*)q, f, n); break;
			case GGML_TYPE_Q5_K: dequantize_row_q5_K((void*)q, f, n); break;
			case GGML_TYPE_Q6_K: dequantize_row_q6_K((void*)q, f, n); break;
			}
			wr(f, 4*(size_t)n);
			break;
		case 'Q':
			rd(f, 4*(size_t)n);
			switch (t) {
			case GGML_TYPE_F32: memcpy(q, f, rb); break;
			case GGML_TYPE_F16: for (uint32_t i = 0; i < n; i++) { uint16_t v = ggml_compute_fp32_to_fp16(f[i]); memcpy(q+2*i, &v, 2); } break;
			case GGML_TYPE_BF16: for (uint32_t i = 0; i < n; i++) { ggml_bf16_t v = ggml_compute_fp32_to_bf16(f[i]); memcpy(q+2*i, &v.bits, 2); } break;
			case GGML_TYPE_Q4_0: quantize_row_q4_0_ref(f, (void*)q, n); break;
			case GGML_TYPE_Q4_1: quantize_row_q4_1_ref(f, (void*)q, n); break;
			case GGML_TYPE_Q5_0: quantize_row_q5_0_ref(f, (void*)q, n); break;
			case GGML_TYPE_Q5_1: quantize_row_q5_1_ref(f, (void*)q, n); break;
			case GGML_TYPE_Q8_0: quantize_row_q8_0_ref(f, (void*)q, n); break;
			case GGML_TYPE_Q4_K: quantize_row_q4_K_ref(f, (void*)q, n); break;
			case GGML_TYPE_Q5_K: quantize_row_q5_K_ref(f, (void*)q, n); break;
			case GGML_TYPE_Q6_K: quantize_row_q6_K_ref(f, (void*)q, n); break;
			}
			wr(q, rb);
			break;
		case 'H':
			rd(h, 2*(size_t)n);
			for (uint32_t i = 0; i < n; i++) f[i] = ggml_compute_fp16_to_fp32(h[i]);
			wr(f, 4*(size_t)n);
			break;
		case 'h': case 'b':
			rd(f, 4*(size_t)n);
			for (uint32_t i = 0; i < n; i++) h[i] = op == 'h' ? ggml_compute_fp32_to_fp16(f[i]) : ggml_compute_fp32_to_bf16(f[i]).bits;
			wr(h, 2*(size_t)n);
			break;
		default:
			fprintf(stderr, "op %c\n", op); exit(6);
		}
		free(q); free(f); free(h);
	}
}
`

// refDir is the reference checkout's directory (CB_REF_DIR as
// scripts/deps.sh defines it).
func refDir() string {
	if d := os.Getenv("CB_REF_DIR"); d != "" {
		return d
	}
	c := os.Getenv("XDG_CACHE_HOME")
	if c == "" {
		h, _ := os.UserHomeDir()
		c = filepath.Join(h, ".cache")
	}
	return filepath.Join(c, "cacheblend", "ref")
}

var (
	harnessOnce sync.Once
	harnessBin  string
	harnessErr  string
)

// ggmlHarness compiles the harness once and returns its path; it fails the
// test when the reference checkout or gcc is missing. The binary is cached
// in the user cache directory under a hash of every source it is built
// from, so only the first run (or a changed checkout) pays for compiling
// ggml-quants.c.
func ggmlHarness(t *testing.T) string {
	t.Helper()
	harnessOnce.Do(func() { harnessBin, harnessErr = buildHarness() })
	if harnessErr != "" {
		t.Fatal(harnessErr)
	}
	return harnessBin
}

func buildHarness() (string, string) {
	src := filepath.Join(refDir(), "llama.cpp", "ggml")
	files := []string{"src/ggml-quants.c", "src/ggml-quants.h", "src/ggml-common.h", "src/ggml-impl.h", "include/ggml.h"}
	h := sha256.New()
	h.Write([]byte(harnessC))
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			return "", "llama.cpp source missing (" + err.Error() + "): run bash scripts/deps.sh"
		}
		h.Write(b)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "cacheblend", "quant-ggml-harness", hex.EncodeToString(h.Sum(nil))[:16])
	bin := filepath.Join(dir, "harness")
	if _, err := os.Stat(bin); err == nil {
		return bin, ""
	}
	cc, err := exec.LookPath("gcc")
	if err != nil {
		return "", "gcc is needed to compile ggml-quants.c: " + err.Error()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err.Error()
	}
	tmp, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return "", err.Error()
	}
	defer os.RemoveAll(tmp)
	main := filepath.Join(tmp, "harness.c")
	if err := os.WriteFile(main, []byte(harnessC), 0o644); err != nil {
		return "", err.Error()
	}
	out := filepath.Join(tmp, "harness")
	cmd := exec.Command(cc, "-O2", "-ffp-contract=off", "-std=gnu11",
		"-I", filepath.Join(src, "include"), "-I", filepath.Join(src, "src"), "-I", filepath.Join(src, "src", "ggml-cpu"),
		main, filepath.Join(src, "src", "ggml-quants.c"), "-lm", "-o", out)
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", "compiling ggml-quants.c: " + err.Error() + "\n" + string(msg)
	}
	if err := os.Rename(out, bin); err != nil {
		return "", err.Error()
	}
	return bin, ""
}

// ggmlBatch accumulates harness requests and runs them in one process.
type ggmlBatch struct {
	in   bytes.Buffer
	outs []int // reply sizes
}

func (b *ggmlBatch) add(op byte, typ Type, n int, payload []byte, replyBytes int) {
	b.in.WriteByte(op)
	binary.Write(&b.in, binary.LittleEndian, uint32(typ))
	binary.Write(&b.in, binary.LittleEndian, uint32(n))
	b.in.Write(payload)
	b.outs = append(b.outs, replyBytes)
}

func (b *ggmlBatch) run(t *testing.T) [][]byte {
	t.Helper()
	cmd := exec.Command(ggmlHarness(t))
	cmd.Stdin = &b.in
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("ggml harness: %v: %s", err, stderr.String())
	}
	replies := make([][]byte, len(b.outs))
	for i, n := range b.outs {
		if len(out) < n {
			t.Fatalf("ggml harness: reply %d short", i)
		}
		replies[i], out = out[:n], out[n:]
	}
	return replies
}

func floatBytes(x []float32) []byte {
	b := make([]byte, 4*len(x))
	for i, v := range x {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

func bytesFloat(b []byte) []float32 {
	x := make([]float32, len(b)/4)
	for i := range x {
		x[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return x
}

// TestGGMLDequantize: DequantizeRow (pure Go and assembly) equals ggml's
// dequantize_row_* bit for bit on random rows (sane scales and fully
// random bytes: NaN, Inf and subnormal scales included).
func TestGGMLDequantize(t *testing.T) { atEachLevel(t, testGGMLDequantize) }

func testGGMLDequantize(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	var b ggmlBatch
	var rows [][]byte
	var types []Type
	for _, typ := range allTypes {
		for _, n := range rowLens(typ) {
			for k := range 6 {
				row := randomRow(r, typ, n)
				if k%2 == 1 {
					for i := range row {
						row[i] = byte(r.Uint32())
					}
				}
				b.add('D', typ, n, row, 4*n)
				rows, types = append(rows, row), append(types, typ)
			}
		}
	}
	for i, rep := range b.run(t) {
		typ, row := types[i], rows[i]
		want := bytesFloat(rep)
		got := make([]float32, len(want))
		if err := DequantizeRow(typ, row, got); err != nil {
			t.Fatal(err)
		}
		for e := range got {
			if !sameBits(got[e], want[e]) {
				t.Fatalf("%v row %d (n=%d) element %d: %v (%#08x), ggml %v (%#08x)", typ, i, len(got), e,
					got[e], math.Float32bits(got[e]), want[e], math.Float32bits(want[e]))
			}
		}
	}
}

// TestGGMLQuantize: Quantize produces ggml's quantize_row_*_ref blocks
// byte for byte, on normal data at several scales, with outliers, and on
// edge rows (zeros, constants, tiny values, a single spike).
func TestGGMLQuantize(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 24))
	type req struct {
		typ Type
		x   []float32
	}
	var reqs []req
	var b ggmlBatch
	for _, typ := range allTypes {
		for _, n := range rowLens(typ) {
			var xs [][]float32
			for _, sd := range []float64{1e-6, 0.02, 1, 1000} {
				xs = append(xs, gauss(r, n, sd), gaussOutliers(r, n, sd))
			}
			edge := make([]float32, n)
			xs = append(xs, edge)
			c := make([]float32, n)
			for i := range c {
				c[i] = -0.3
			}
			xs = append(xs, c)
			s := make([]float32, n)
			s[n/2] = 7
			xs = append(xs, s)
			u := make([]float32, n)
			for i := range u {
				u[i] = float32(r.IntN(9) - 4) // ties in the rounding
			}
			xs = append(xs, u)
			for _, x := range xs {
				reqs = append(reqs, req{typ, x})
				b.add('Q', typ, n, floatBytes(x), mustRowBytes(t, typ, n))
			}
		}
	}
	for i, rep := range b.run(t) {
		q := reqs[i]
		got := make([]byte, len(rep))
		if err := Quantize(q.typ, q.x, got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, rep) {
			j := 0
			for got[j] == rep[j] {
				j++
			}
			t.Fatalf("%v request %d (n=%d): byte %d (block %d) is %#02x, ggml %#02x", q.typ, i, len(q.x), j, j/q.typ.TypeSize(), got[j], rep[j])
		}
	}
}

// TestGGMLHalf: the F16/BF16 conversions equal ggml's software ones: every
// half to float, and floats around every rounding tie plus random ones
// back to half and bf16.
func TestGGMLHalf(t *testing.T) {
	var b ggmlBatch
	hs := make([]byte, 2<<16)
	for i := range 1 << 16 {
		binary.LittleEndian.PutUint16(hs[2*i:], uint16(i))
	}
	b.add('H', 0, 1<<16, hs, 4<<16)
	r := rand.New(rand.NewPCG(25, 26))
	var fs []float32
	for i := range 0x7c00 {
		lo, hi := float64(F16ToF32(uint16(i))), float64(F16ToF32(uint16(i+1)))
		mid := float32((lo + hi) / 2)
		fs = append(fs, mid, -mid, math.Nextafter32(mid, 0), math.Nextafter32(mid, 1e9))
	}
	for range 200000 {
		fs = append(fs, math.Float32frombits(r.Uint32()))
	}
	fs = append(fs, float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), math.MaxFloat32, 0x1p-149)
	b.add('h', 0, len(fs), floatBytes(fs), 2*len(fs))
	b.add('b', 0, len(fs), floatBytes(fs), 2*len(fs))
	rep := b.run(t)
	for i, want := range bytesFloat(rep[0]) {
		if got := F16ToF32(uint16(i)); !sameBits(got, want) {
			t.Fatalf("F16ToF32(%#04x) = %#08x, ggml %#08x", i, math.Float32bits(got), math.Float32bits(want))
		}
	}
	for i, f := range fs {
		if got, want := F32ToF16(f), binary.LittleEndian.Uint16(rep[1][2*i:]); got != want {
			t.Fatalf("F32ToF16(%#08x) = %#04x, ggml %#04x", math.Float32bits(f), got, want)
		}
		if got, want := F32ToBF16(f), binary.LittleEndian.Uint16(rep[2][2*i:]); got != want {
			t.Fatalf("F32ToBF16(%#08x) = %#04x, ggml %#04x", math.Float32bits(f), got, want)
		}
	}
}
