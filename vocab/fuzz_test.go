package vocab

import (
	"bytes"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/cacheblend/cacheblend/gguf"
)

// FuzzTokenize tokenizes random text with a byte-level BPE (gpt-2,
// llama-bpe) and a SentencePiece (llama-spm) vocabulary: it never panics,
// Decode(Encode(s)) is s for valid UTF-8 (with the space prefix for
// llama-spm, whose "▁" also decodes as a space), and streaming decoding
// with Incomplete concatenates to Decode.
func FuzzTokenize(f *testing.F) {
	vs := map[string]*Vocab{}
	for _, n := range []string{"gpt-2", "llama-bpe", "llama-spm"} {
		vs[n] = loadVocab(f, vocabPath(f, n))
	}
	for _, s := range []string{"", "Hello, world!", " this is 🦙.cpp", "нещо на Български", "  \t\n\r\n  x", "3333333",
		"<|begin_of_text|>hi<|eot_id|>", "<s>[INST] hi [/INST]</s>", "\xe2\x82", "\xff\xfe", "it's 'S 'll", "e\u0301\u0308"} {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, s string, parse bool) {
		for name, v := range vs {
			ids := v.Tokenize(s, true, parse)
			for _, id := range ids {
				if id < 0 || int(id) >= v.Size() {
					t.Fatalf("%s: id %d out of range", name, id)
				}
			}
			if got, want := streamDecode(v, ids), v.Decode(ids); got != want {
				t.Fatalf("%s: streamed %q, Decode %q", name, got, want)
			}
			if !utf8.ValidString(s) {
				continue
			}
			enc := v.Encode(s)
			want := s
			if v.model == modelSPM {
				if strings.Contains(s, "\u2581") {
					continue
				}
				if s != "" {
					want = " " + s
				}
			}
			if got := v.Decode(enc); got != want {
				t.Fatalf("%s: Decode(Encode(%q)) = %q", name, s, got)
			}
		}
	})
}

// FuzzNew builds vocabularies from random specs: New never panics, and a
// Vocab it returns tokenizes and decodes without panicking.
func FuzzNew(f *testing.F) {
	f.Add([]byte("\x00<s>\x00</s>\x00a\x00b\x00ab\x00<0x41>\x00\xe2\x96\x81a"), "aab <s>b")
	f.Add([]byte("\x01a\x00b\x00c\x00ab\x00abc\x00\xc4\xa0a"), " abc abc")
	f.Add([]byte("\x01<|im_start|>\x00<|im_end|>\x00x\x00y\x00xy"), "<|im_start|>xy<|im_end|>")
	f.Fuzz(func(t *testing.T, data []byte, text string) {
		if len(data) == 0 {
			return
		}
		s := DefaultSpec("", "") // every special id -1
		ctl := data[0]
		if ctl&1 == 0 {
			s.Model = "llama"
		} else {
			s.Model = "gpt2"
			s.Pre = SupportedPre()[int(ctl>>1)%len(SupportedPre())]
		}
		parts := bytes.Split(data[1:], []byte{0})
		if len(parts) > 64 {
			parts = parts[:64]
		}
		for i, p := range parts {
			s.Tokens = append(s.Tokens, string(p))
			s.Types = append(s.Types, int32(i*7+int(ctl))%8)
			s.Scores = append(s.Scores, float32(len(p))-float32(i)/10)
		}
		for i := 0; i+1 < len(parts); i++ {
			s.Merges = append(s.Merges, string(parts[i])+" "+string(parts[i+1]))
		}
		n := int32(len(s.Tokens))
		s.BOS = int32(ctl)%(n+1) - 1
		s.EOS = int32(ctl>>3)%(n+1) - 1
		s.AddBOS = ctl&0x20 != 0 && s.BOS >= 0
		s.AddEOS = ctl&0x40 != 0 && s.EOS >= 0
		s.AddSpacePrefix = ctl&0x80 != 0
		s.Name = text
		v, err := New(s)
		if err != nil {
			return
		}
		for _, parse := range []bool{false, true} {
			ids := v.Tokenize(text, true, parse)
			v.Decode(ids)
			v.Incomplete(ids)
			v.Detokenize(ids, parse, !parse)
		}
	})
}

// FuzzSpecFromGGUF reads tokenizers from random GGUF files: neither
// SpecFromGGUF nor New panics.
func FuzzSpecFromGGUF(f *testing.F) {
	for _, base := range []Spec{tinySPM(), tinyBPE()} {
		kv := []gguf.KV{{Key: keyModel, Value: base.Model}, {Key: keyPre, Value: base.Pre}, {Key: keyTokens, Value: base.Tokens},
			{Key: keyTypes, Value: base.Types}, {Key: "tokenizer.ggml.bos_token_id", Value: uint32(1)}}
		if base.Scores != nil {
			kv = append(kv, gguf.KV{Key: keyScores, Value: base.Scores})
		}
		if base.Merges != nil {
			kv = append(kv, gguf.KV{Key: keyMerges, Value: base.Merges})
		}
		b, err := gguf.Encode(kv, nil)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(b[:len(b)/2])
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		g, err := gguf.Parse(data)
		if err != nil {
			return
		}
		v, err := FromGGUF(g)
		if err != nil {
			return
		}
		ids := v.Tokenize("hello <s> world", true, true)
		v.Decode(ids)
	})
}
