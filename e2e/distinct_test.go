package e2e

import (
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"
)

// requireDistinctText fails t unless the answers (to different prompts, or
// sampled with different seeds) are non-trivial — at least 3 distinct
// characters, not one repeated — and pairwise different, neither a prefix
// of the other (answers of different lengths): the served model's answer
// depends on the prompt, so a test that compares answers of two
// configurations for equality can fail.
func requireDistinctText(t *testing.T, answers ...string) {
	t.Helper()
	if err := distinctText(answers); err != nil {
		t.Fatal(err)
	}
	t.Logf("answers that differ: %q", answers)
}

func distinctText(answers []string) error {
	for i, a := range answers {
		runes := map[rune]bool{}
		for _, r := range a {
			runes[r] = true
		}
		if len(runes) < 3 {
			return fmt.Errorf("answer %d %q is trivial (%d distinct characters in %d)", i, a, len(runes), utf8.RuneCountInString(a))
		}
		for j, b := range answers[:i] {
			if strings.HasPrefix(a, b) || strings.HasPrefix(b, a) {
				return fmt.Errorf("answers %d %q and %d %q agree: comparing answers proves nothing", j, b, i, a)
			}
		}
	}
	return nil
}

func TestDistinctText(t *testing.T) {
	for _, tc := range []struct {
		name    string
		answers []string
		ok      bool
	}{
		{"distinct", []string{"abc", "abd"}, true},
		{"equal", []string{"abc", "abc"}, false},
		{"prefix", []string{"abcdef", "abc"}, false},
		{"one character repeated", []string{"\n\n\n\n", "abc"}, false},
		{"empty", []string{"", "abc"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := distinctText(tc.answers); (err == nil) != tc.ok {
				t.Fatalf("distinctText(%q) = %v", tc.answers, err)
			}
		})
	}
}
