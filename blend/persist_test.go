package blend

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cacheblend/cacheblend/blend/chunkstore"
	"github.com/cacheblend/cacheblend/blend/fingerprint"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
)

func TestSequenceFileRoundTrip(t *testing.T) {
	seq := fingerprint.Sequence{Tokens: []int32{1, 2, 3, 4, 5}, ChunkSize: 4,
		Keys: chunkstore.ChainKeys(testModel, 0, []int32{1, 2, 3, 4, 5}, 4)}
	b := encodeSequenceFile(testModel, seq)
	model, got, err := decodeSequenceFile(b)
	if err != nil || model != testModel || !slices.Equal(got.Tokens, seq.Tokens) || !slices.Equal(got.Keys, seq.Keys) || got.ChunkSize != 4 {
		t.Fatalf("decoded %q %+v %v", model, got, err)
	}
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"truncated", b[:len(b)-1]},
		{"flipped byte", func() []byte { c := slices.Clone(b); c[10] ^= 1; return c }()},
		{"other magic", append([]byte("XXXX"), b[4:]...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, err := decodeSequenceFile(tc.b); err == nil {
				t.Fatal("decoded")
			}
		})
	}
}

// FuzzDecodeSequenceFile: a sequence file read back from disk never
// panics and, when it decodes, is bounded and re-encodes to itself.
func FuzzDecodeSequenceFile(f *testing.F) {
	seq := fingerprint.Sequence{Tokens: []int32{1, 2, 3}, ChunkSize: 2, Keys: chunkstore.ChainKeys("m", 0, []int32{1, 2, 3}, 2)}
	f.Add(encodeSequenceFile("m", seq))
	f.Add([]byte("CBS1"))
	f.Fuzz(func(t *testing.T, b []byte) {
		model, s, err := decodeSequenceFile(b)
		if err != nil {
			return
		}
		if len(model) == 0 || len(model) > chunkstore.MaxModelLen || len(s.Keys) != (len(s.Tokens)+s.ChunkSize-1)/s.ChunkSize {
			t.Fatalf("unbounded: model %d bytes, %d tokens, %d keys", len(model), len(s.Tokens), len(s.Keys))
		}
		if !slices.Equal(encodeSequenceFile(model, s), b) {
			t.Fatal("does not re-encode to itself")
		}
	})
}

// TestSequencesSurviveRestart: a document stored in a blend server with an
// L2 is matched at another position of a prompt by the next server on the
// same L2 directory (its chunks from the chunk files, its fingerprints from
// the sequence file), and sequences whose chunks are gone, or whose file is
// broken, are dropped at start-up.
func TestSequencesSurviveRestart(t *testing.T) {
	for _, tc := range []struct {
		name      string
		damage    func(t *testing.T, dir string, keys []chunkstore.Key)
		wantFound int32
	}{
		{"intact", func(*testing.T, string, []chunkstore.Key) {}, 2},
		{"chunk file gone", func(t *testing.T, dir string, keys []chunkstore.Key) {
			if err := os.Remove(filepath.Join(dir, keys[1].String()+".chunk")); err != nil {
				t.Fatal(err)
			}
		}, 0},
		{"sequence file corrupt", func(t *testing.T, dir string, keys []chunkstore.Key) {
			path := filepath.Join(dir, seqDirName, keys[len(keys)-1].String()+seqExt)
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			b[len(b)/2] ^= 0xff
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			e, _, doc := docEnv(t, Config{L2Dir: dir})
			e.shutdown()
			keys := chunkstore.ChainKeys(testModel, 0, doc, 256)
			seqFile := filepath.Join(dir, seqDirName, keys[len(keys)-1].String()+seqExt)
			if fi, err := os.Stat(seqFile); err != nil || fi.Mode().Perm() != 0o600 {
				t.Fatalf("sequence file: %v %v", fi, err)
			}
			tc.damage(t, dir, keys)

			e2 := newEnv(t, Config{L2Dir: dir})
			res := e2.lookup(&cbv1.LookupRequest{RequestId: "after-restart", Tokens: promptWith(promptN, 700, doc, 1), WorldSize: 1, Model: testModel})
			if res.GetFound() != tc.wantFound {
				t.Fatalf("lookup after the restart: found %d, want %d (%+v)", res.GetFound(), tc.wantFound, res)
			}
			if tc.wantFound > 0 && res.GetNonPrefixHitTokens() != docLen {
				t.Fatalf("non-prefix hit tokens %d, want %d", res.GetNonPrefixHitTokens(), docLen)
			}
			if _, err := os.Stat(seqFile); (tc.wantFound > 0) != (err == nil) {
				t.Fatalf("sequence file kept %v, want %v", err == nil, tc.wantFound > 0)
			}
		})
	}
}
