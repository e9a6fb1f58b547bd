package main

import (
	"testing"

	"github.com/spf13/cobra"
)

func TestEnvName(t *testing.T) {
	tests := []struct{ cmd, flag, want string }{
		{"engine", "api-key", "CB_ENGINE_API_KEY"},
		{"slo-rules", "out", "CB_SLO_RULES_OUT"},
		{"blend", "l2-dir", "CB_BLEND_L2_DIR"},
	}
	for _, tc := range tests {
		t.Run(tc.want, func(t *testing.T) {
			if got := envName(tc.cmd, tc.flag); got != tc.want {
				t.Fatalf("envName(%q, %q) = %q", tc.cmd, tc.flag, got)
			}
		})
	}
}

// Defaults, then environment, then flags.
func TestApplyEnvPrecedence(t *testing.T) {
	tests := []struct {
		name, env string
		args      []string
		want      int
		wantErr   bool
	}{
		{"default", "", nil, 7, false},
		{"environment", "9", nil, 9, false},
		{"flag wins", "9", []string{"--max-queue=11"}, 11, false},
		{"bad environment", "nine", nil, 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.env != "" {
				t.Setenv("CB_ENGINE_MAX_QUEUE", tc.env)
			}
			var got int
			cmd := &cobra.Command{Use: "engine", RunE: func(*cobra.Command, []string) error { return nil }}
			cmd.Flags().IntVar(&got, "max-queue", 7, "")
			withEnv(cmd)
			cmd.SetArgs(tc.args)
			err := cmd.Execute()
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v", err)
			}
			if !tc.wantErr && got != tc.want {
				t.Fatalf("max-queue = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestEverySubcommandIsRegistered(t *testing.T) {
	root := newRoot()
	for _, name := range []string{"engine", "worker", "blend", "traces", "check", "up", "demo", "load", "slo-rules", "certs", "gateway"} {
		if c, _, err := root.Find([]string{name}); err != nil || c.Name() != name {
			t.Errorf("subcommand %s missing", name)
		}
	}
}

// CB_GATEWAY_ENGINE sets the repeatable --engine flag (comma-separated URLs).
func TestGatewayEnginesFromEnvironment(t *testing.T) {
	t.Setenv("CB_GATEWAY_ENGINE", "http://127.0.0.1:8001,http://127.0.0.1:8002")
	cmd := newGatewayCmd()
	var got []string
	cmd.RunE = func(c *cobra.Command, _ []string) error {
		got, _ = c.Flags().GetStringSlice("engine")
		return nil
	}
	cmd.SetArgs(nil)
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != "http://127.0.0.1:8001" || got[1] != "http://127.0.0.1:8002" {
		t.Fatalf("engines %v", got)
	}
}
