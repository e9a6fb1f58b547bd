package chunkstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math"
	"testing"
)

func TestChainKeys(t *testing.T) {
	tokens := make([]int32, 600)
	for i := range tokens {
		tokens[i] = int32(i * 7)
	}
	keys := ChainKeys("m", 0, tokens, 256)
	if len(keys) != 3 {
		t.Fatalf("got %d keys for 600 tokens, want 3", len(keys))
	}
	tests := []struct {
		name     string
		keys     []Key
		wantSame int // leading keys equal to keys
	}{
		{"deterministic", ChainKeys("m", 0, tokens, 256), 3},
		{"default chunk size", ChainKeys("m", 0, tokens, 0), 3},
		{"other model", ChainKeys("m2", 0, tokens, 256), 0},
		{"other rank", ChainKeys("m", 1, tokens, 256), 0},
		{"shared first chunk", ChainKeys("m", 0, append(append([]int32(nil), tokens[:256]...), 1, 2, 3), 256), 1},
		{"last token differs", ChainKeys("m", 0, append(append([]int32(nil), tokens[:599]...), -1), 256), 2},
		{"truncated tail", ChainKeys("m", 0, tokens[:590], 256), 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			same := 0
			for same < len(tc.keys) && same < len(keys) && tc.keys[same] == keys[same] {
				same++
			}
			if same != tc.wantSame {
				t.Fatalf("%d leading keys equal, want %d", same, tc.wantSame)
			}
			for i := same; i < len(tc.keys) && i < len(keys); i++ {
				if tc.keys[i] == keys[i] {
					t.Fatalf("key %d equal after a difference", i)
				}
			}
		})
	}
	if got := ChainKeys("m", 0, nil, 256); len(got) != 0 {
		t.Fatalf("empty sequence gave %d keys", len(got))
	}
}

func TestCountPrefix(t *testing.T) {
	keys := ChainKeys("m", 0, make([]int32, 1000), 256)
	have := map[Key]bool{keys[0]: true, keys[1]: true, keys[3]: true}
	if got := CountPrefix(keys, func(k Key) bool { return have[k] }); got != 2 {
		t.Fatalf("CountPrefix = %d, want 2", got)
	}
	if got := CountPrefix(keys, func(Key) bool { return true }); got != 4 {
		t.Fatalf("CountPrefix(all) = %d, want 4", got)
	}
	if got := CountPrefix(nil, func(Key) bool { return true }); got != 0 {
		t.Fatalf("CountPrefix(nil) = %d", got)
	}
}

func TestKeyParse(t *testing.T) {
	k := ChainKeys("m", 0, []int32{1, 2, 3}, 256)[0]
	p, err := ParseKey(k.String())
	if err != nil || p != k {
		t.Fatalf("ParseKey(String) = %v, %v", p, err)
	}
	b, err := KeyFromBytes(k[:])
	if err != nil || b != k {
		t.Fatalf("KeyFromBytes = %v, %v", b, err)
	}
	if _, err := KeyFromBytes(k[:5]); err == nil {
		t.Fatal("KeyFromBytes accepted 5 bytes")
	}
	if _, err := ParseKey("zz"); err == nil {
		t.Fatal("ParseKey accepted garbage")
	}
}

func TestCodecRoundTrip(t *testing.T) {
	tests := []struct {
		name  string
		n     int
		model string
	}{
		{"one token", 1, "m"},
		{"full chunk", 256, "llama-test"},
		{"odd length", 44, ""},
		{"long model name", 17, string(bytes.Repeat([]byte("x"), MaxModelLen))},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := randChunk(t, uint64(i), tc.n)
			c.Model = tc.model
			data, err := EncodeChunk(c)
			if err != nil {
				t.Fatal(err)
			}
			if int64(len(data)) != EncodedSize(c) {
				t.Fatalf("encoded %d bytes, EncodedSize %d", len(data), EncodedSize(c))
			}
			got, err := DecodeChunk(data)
			if err != nil {
				t.Fatal(err)
			}
			if err := diffChunks(c, got); err != nil {
				t.Fatal(err)
			}
			// The aliasing decoder agrees too.
			got2, err := decode(bytes.Clone(data), true)
			if err != nil {
				t.Fatal(err)
			}
			if err := diffChunks(c, got2); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// recrc rewrites the trailing checksum so a test can reach the header checks.
func recrc(b []byte) []byte {
	binary.LittleEndian.PutUint32(b[len(b)-4:], crc32.Checksum(b[:len(b)-4], castagnoli))
	return b
}

func TestDecodeCorrupt(t *testing.T) {
	c := randChunk(t, 42, 20)
	good, err := EncodeChunk(c)
	if err != nil {
		t.Fatal(err)
	}
	mod := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	tests := []struct {
		name string
		data []byte
	}{
		{"empty", nil},
		{"header only", good[:fixedHdr]},
		{"truncated by one", good[:len(good)-1]},
		{"truncated in half", good[:len(good)/2]},
		{"trailing byte", append(bytes.Clone(good), 0)},
		{"flip byte in middle", mod(func(b []byte) []byte { b[len(b)/2] ^= 0x10; return b })},
		{"flip checksum", mod(func(b []byte) []byte { b[len(b)-1] ^= 1; return b })},
		{"wrong magic", mod(func(b []byte) []byte { copy(b, "NOTACHNK"); return recrc(b) })},
		{"wrong version", mod(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[8:], 2); return recrc(b) })},
		{"token count too big", mod(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[72:], 21); return recrc(b) })},
		{"token count huge", mod(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[72:], math.MaxUint32); return recrc(b) })},
		{"zero layers", mod(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[52:], 0); return recrc(b) })},
		{"layers mismatch size", mod(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[52:], 3); return recrc(b) })},
		{"NaN theta", mod(func(b []byte) []byte {
			binary.LittleEndian.PutUint64(b[64:], math.Float64bits(math.NaN()))
			return recrc(b)
		})},
		{"positions start mismatch", mod(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[76:], 999); return recrc(b) })},
		{"reserved set", mod(func(b []byte) []byte { b[82] = 1; return recrc(b) })},
		{"header length wrong", mod(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[12:], 64); return recrc(b) })},
		{"model length past header", mod(func(b []byte) []byte { binary.LittleEndian.PutUint16(b[80:], 900); return recrc(b) })},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeChunk(tc.data)
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("err = %v, want ErrCorrupt", err)
			}
			if got != nil {
				t.Fatal("returned a chunk with an error")
			}
		})
	}
}

// Every single-bit flip of a small encoding is detected.
func TestDecodeEveryBitFlip(t *testing.T) {
	c := randChunk(t, 3, 2)
	good, err := EncodeChunk(c)
	if err != nil {
		t.Fatal(err)
	}
	for i := range len(good) * 8 {
		b := bytes.Clone(good)
		b[i/8] ^= 1 << (i % 8)
		if _, err := DecodeChunk(b); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("flip of bit %d not detected: %v", i, err)
		}
	}
}

func FuzzDecodeChunk(f *testing.F) {
	for i, n := range []int{1, 3, 16} {
		c := randChunk(f, uint64(i), n)
		data, err := EncodeChunk(c)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data, uint32(0))
		f.Add(data[:len(data)/2], uint32(5))
		f.Add(data, uint32(len(data)*4))
	}
	f.Add([]byte(fileMagic), uint32(1))
	f.Fuzz(func(t *testing.T, data []byte, flip uint32) {
		c, err := DecodeChunk(data)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error not wrapping ErrCorrupt: %v", err)
			}
			return
		}
		if c.Validate() != nil {
			t.Fatalf("decoded an invalid chunk: %v", c.Validate())
		}
		// A successful decode is canonical: re-encoding gives the input back.
		again, err := EncodeChunk(c)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		if !bytes.Equal(again, data) {
			t.Fatal("re-encoding differs from the decoded input")
		}
		// The CRC guards every bit.
		b := bytes.Clone(data)
		bit := int(flip % uint32(len(b)*8))
		b[bit/8] ^= 1 << (bit % 8)
		if _, err := DecodeChunk(b); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("flip of bit %d not detected: %v", bit, err)
		}
	})
}
