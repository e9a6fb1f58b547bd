package vocab

import (
	"slices"
	"testing"
)

func TestTexts(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tokens []string
	}{
		{"none", nil},
		{"one", []string{"a"}},
		{"several, one long, multibyte", []string{"<s>", "▁the", "x", "ĠHello", "日本語", "<|im_end|>"}},
		{"repeated texts", []string{"ab", "ab", "b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x, ok := newTexts(tc.tokens)
			if !ok {
				t.Fatal("newTexts refused")
			}
			if x.len() != len(tc.tokens) {
				t.Fatalf("len %d, want %d", x.len(), len(tc.tokens))
			}
			var got []string
			for i, s := range x.all() {
				if s != x.at(i) {
					t.Fatalf("all yields %q at %d, at gives %q", s, i, x.at(i))
				}
				got = append(got, s)
			}
			if !slices.Equal(got, tc.tokens) {
				t.Fatalf("texts %q, want %q", got, tc.tokens)
			}
			for i := range x.all() { // stops when asked
				if i > 0 {
					t.Fatal("all went on after yield returned false")
				}
				break
			}
		})
	}
}
