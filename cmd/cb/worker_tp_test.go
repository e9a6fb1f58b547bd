package main

import (
	"slices"
	"testing"
)

func TestRankArgs(t *testing.T) {
	cases := []struct {
		name    string
		flags   []string
		rank    int
		want    []string // present
		notWant []string // absent
	}{
		{"inherits the model and peers, not the addresses", []string{"--layers=4", "--blend=127.0.0.1:1", "--addr=127.0.0.1:7", "--metrics-addr=127.0.0.1:8", "--tp=2"}, 1,
			[]string{"worker", "--layers=4", "--blend=127.0.0.1:1", "--addr=127.0.0.1:0", "--tp=4", "--tp-rank=1", "--worker-id=w"},
			// the rank's /metrics listener is handed over as a descriptor (rankgroup.MetricsFD)
			[]string{"--addr=127.0.0.1:7", "--metrics-addr=127.0.0.1:8", "--metrics-addr=127.0.0.1:0"}},
		{"the group's worker id wins", []string{"--worker-id=mine"}, 3,
			[]string{"--worker-id=w", "--tp-rank=3"}, []string{"--worker-id=mine"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cmd := newWorkerCmd()
			if err := cmd.ParseFlags(c.flags); err != nil {
				t.Fatal(err)
			}
			got := rankArgs(cmd, "w", 4)(c.rank)
			for _, w := range c.want {
				if !slices.Contains(got, w) {
					t.Errorf("args %v lack %s", got, w)
				}
			}
			for _, w := range c.notWant {
				if slices.Contains(got, w) {
					t.Errorf("args %v carry %s", got, w)
				}
			}
		})
	}
}
