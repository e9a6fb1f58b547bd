package vocab

import (
	"slices"
	"testing"
)

// TestMergeRanks checks the merge table's two halves: merges between
// tokens (ranked by the sides' ids) and merges with a side that is no
// token (kept by text), a repeated merge keeping its first rank in both.
func TestMergeRanks(t *testing.T) {
	// withTokens is tinyBPE's byte tokens less drop, plus extra tokens.
	withTokens := func(drop string, extra ...string) Spec {
		s := DefaultSpec("gpt2", "gpt-2")
		for b := 0; b < 256; b++ {
			if byteToUnicode[b] != drop {
				s.Tokens = append(s.Tokens, byteToUnicode[b])
			}
		}
		s.Tokens = append(s.Tokens, extra...)
		return s
	}
	tests := []struct {
		name   string
		spec   Spec
		merges []string
		text   string
		want   []string // token texts
	}{
		{"between tokens", withTokens("", "ab", "bc"), []string{"b c", "a b"}, "abc", []string{"a", "bc"}},
		{"between tokens, other order", withTokens("", "ab", "bc"), []string{"a b", "b c"}, "abc", []string{"ab", "c"}},
		{"repeat keeps the first rank", withTokens("", "ab", "bc"), []string{"b c", "a b", "b c"}, "abc", []string{"a", "bc"}},
		{"a side no token", withTokens("x", "xy"), []string{"x y"}, "xy", []string{"xy"}},
		{"a side no token, repeated", withTokens("x", "xy", "yz"), []string{"x y", "y z", "x y"}, "xyz", []string{"xy", "z"}},
		{"unmerged side no token", withTokens("x", "yz"), []string{"y z"}, "xyz", []string{"yz"}}, // "x" has no token: dropped, as llama.cpp does
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.spec.Merges = tt.merges
			v, err := New(tt.spec)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, id := range v.Encode(tt.text) {
				got = append(got, v.TokenText(id))
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("Encode(%q) = %q, want %q", tt.text, got, tt.want)
			}
		})
	}
}

// TestTokenIndex checks the id lookup against every token of a vocabulary
// and texts that are none.
func TestTokenIndex(t *testing.T) {
	s := tinyBPE()
	v, err := New(s)
	if err != nil {
		t.Fatal(err)
	}
	for i, tok := range s.Tokens {
		if id, ok := v.ID(tok); !ok || id != int32(i) {
			t.Errorf("ID(%q) = %d, %v; want %d", tok, id, ok, i)
		}
	}
	for _, text := range []string{"", "hello", "Ġhelloo", "<|endoftext|>x"} {
		if id, ok := v.ID(text); ok {
			t.Errorf("ID(%q) = %d, want none", text, id)
		}
	}
}
