package main

import (
	"strings"
	"testing"
)

// TestBenchFlagBounds: cb bench refuses counts and lengths out of range
// with an error naming the flag, before it generates or runs anything.
func TestBenchFlagBounds(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"prompt too long", []string{"--prompts", "512,9000"}, "--prompts"},
		{"no reps", []string{"--reps", "0"}, "--reps: 0"},
		{"too many steps", []string{"--decode-steps", "5000"}, "--decode-steps: 5000"},
		{"no rounds", []string{"--decode-rounds", "0"}, "--decode-rounds: 0"},
		{"negative decode context", []string{"--decode-context", "-1"}, "--decode-context: -1"},
		{"decode context too long", []string{"--decode-context", "9000"}, "--decode-context: 9000"},
		{"no batch context", []string{"--batch-context", "0"}, "--batch-context: 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := run(t, append([]string{"bench", "--dir", t.TempDir()}, tc.args...)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("cb bench %v: %v, want an error naming %q\n%s", tc.args, err, tc.want, out)
			}
		})
	}
}
