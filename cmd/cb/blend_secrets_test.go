package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/cacheblend/cacheblend/blend/fleet"
)

// TestFleetSecrets: the Redis password never comes from the command line
// (--redis-url with a password there is refused; the same URL from
// CB_BLEND_REDIS_URL, a URL file or a password file is taken), and a fleet
// tier needs a fleet key from a file or CB_BLEND_FLEET_KEY.
func TestFleetSecrets(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const key = "0123456789abcdef0123456789abcdef"
	keyFile := write("key", key+"\n", 0o600)
	worldKey := write("key-world", key, 0o644)
	shortKey := write("key-short", "short", 0o600)
	urlFile := write("url", "redis://:s3cret@127.0.0.1:6379\n", 0o600)
	pwFile := write("pw", "s3cret", 0o640)
	for _, tc := range []struct {
		name    string
		args    []string
		env     map[string]string
		wantURL string // "" with wantErr
		wantErr string
	}{
		{name: "password in argv refused", args: []string{"--redis-url", "redis://:s3cret@127.0.0.1:6379", "--fleet-key-file", keyFile},
			wantErr: "command line"},
		{name: "password in the environment", env: map[string]string{"CB_BLEND_REDIS_URL": "redis://:s3cret@127.0.0.1:6379", "CB_BLEND_FLEET_KEY": key},
			wantURL: "redis://:s3cret@127.0.0.1:6379"},
		{name: "URL without password in argv", args: []string{"--redis-url", "redis://127.0.0.1:6379", "--fleet-key-file", keyFile},
			wantURL: "redis://127.0.0.1:6379"},
		{name: "URL file", args: []string{"--redis-url-file", urlFile, "--fleet-key-file", keyFile}, wantURL: "redis://:s3cret@127.0.0.1:6379"},
		{name: "password file", args: []string{"--redis-url", "redis://app@127.0.0.1:6379", "--redis-password-file", pwFile, "--fleet-key-file", keyFile},
			wantURL: "redis://app:s3cret@127.0.0.1:6379"},
		{name: "URL file and URL", args: []string{"--redis-url", "redis://127.0.0.1:6379", "--redis-url-file", urlFile, "--fleet-key-file", keyFile},
			wantErr: "both set"},
		{name: "no key", args: []string{"--redis-url", "redis://127.0.0.1:6379"}, wantErr: "fleet key"},
		{name: "short key", args: []string{"--redis-url", "redis://127.0.0.1:6379", "--fleet-key-file", shortKey}, wantErr: "at least 32"},
		{name: "world-readable key file", args: []string{"--redis-url", "redis://127.0.0.1:6379", "--fleet-key-file", worldKey}, wantErr: "every user"},
		{name: "key file and key env", args: []string{"--redis-url", "redis://127.0.0.1:6379", "--fleet-key-file", keyFile},
			env: map[string]string{"CB_BLEND_FLEET_KEY": key}, wantErr: "both set"},
		{name: "no fleet tier", args: nil, wantURL: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var fc fleet.Config
			var sf fleetSecretFiles
			cmd := &cobra.Command{Use: "blend", RunE: func(c *cobra.Command, _ []string) error {
				return resolveFleetSecrets(c.Flags(), &fc, sf, os.Getenv)
			}}
			cmd.Flags().StringVar(&fc.URL, "redis-url", "", "")
			cmd.Flags().StringVar(&sf.urlFile, "redis-url-file", "", "")
			cmd.Flags().StringVar(&sf.passwordFile, "redis-password-file", "", "")
			cmd.Flags().StringVar(&sf.keyFile, "fleet-key-file", "", "")
			withEnv(cmd)
			cmd.SetArgs(tc.args)
			cmd.SilenceUsage, cmd.SilenceErrors = true, true
			err := cmd.Execute()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one containing %q", err, tc.wantErr)
				}
				if strings.Contains(err.Error(), "s3cret") {
					t.Fatalf("the error shows the password: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if fc.URL != tc.wantURL || (tc.wantURL != "" && string(fc.Key) != key) {
				t.Fatalf("URL %q key %q, want %q and the key", fc.URL, fc.Key, tc.wantURL)
			}
		})
	}
}

// The real cb blend command has the flags resolveFleetSecrets reads.
func TestBlendHasSecretFlags(t *testing.T) {
	f := newBlendCmd().Flags()
	for _, name := range []string{"redis-url", "redis-url-file", "redis-password-file", "fleet-key-file"} {
		if f.Lookup(name) == nil {
			t.Errorf("cb blend has no --%s", name)
		}
	}
}
