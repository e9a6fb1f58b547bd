package mtls_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/rpc/mtls"
)

func TestWriteCALoadCAWriteHost(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ca")
	ca, err := mtls.WriteCA(dir, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mtls.WriteCA(dir, time.Hour); !errors.Is(err, mtls.ErrExists) {
		t.Fatalf("second WriteCA: %v, want ErrExists", err)
	}
	loaded, err := mtls.LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !loaded.Certificate().Equal(ca.Certificate()) {
		t.Fatal("LoadCA returned another certificate")
	}
	host := filepath.Join(dir, "hosts", "a")
	if err := loaded.WriteHost(host, []mtls.Role{mtls.Worker, mtls.Blend}, append([]string{"10.0.0.1"}, mtls.DefaultHosts...), time.Hour, false); err != nil {
		t.Fatal(err)
	}
	for _, r := range []mtls.Role{mtls.Worker, mtls.Blend} {
		if _, err := mtls.Load(mtls.DirFiles(host, r), r); err != nil {
			t.Errorf("%s: %v", r, err)
		}
	}
	if _, err := os.Stat(filepath.Join(host, mtls.CertFile(mtls.Engine))); err == nil {
		t.Error("an engine certificate was written")
	}
	if err := loaded.WriteHost(host, []mtls.Role{mtls.Engine, mtls.Worker}, nil, time.Hour, false); !errors.Is(err, mtls.ErrExists) {
		t.Fatalf("WriteHost over existing files: %v", err)
	}
	if _, err := os.Stat(filepath.Join(host, mtls.CertFile(mtls.Engine))); err == nil {
		t.Error("a refused WriteHost wrote the engine's certificate")
	}
	if err := loaded.WriteHost(host, nil, nil, time.Hour, false); err == nil {
		t.Error("WriteHost without roles")
	}

	// A key that is not the CA's, and a missing key.
	otherDir := filepath.Join(t.TempDir(), "other")
	if _, err := mtls.WriteCA(otherDir, time.Hour); err != nil {
		t.Fatal(err)
	}
	mixed := t.TempDir()
	copyFile(t, filepath.Join(dir, mtls.CAFile), filepath.Join(mixed, mtls.CAFile))
	copyFile(t, filepath.Join(otherDir, mtls.CAKeyFile), filepath.Join(mixed, mtls.CAKeyFile))
	if _, err := mtls.LoadCA(mixed); err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Errorf("LoadCA with another CA's key: %v", err)
	}
	os.Remove(filepath.Join(mixed, mtls.CAKeyFile))
	if _, err := mtls.LoadCA(mixed); err == nil {
		t.Error("LoadCA without a key")
	}
}

func TestParseRole(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want mtls.Role
		ok   bool
	}{
		{"engine", mtls.Engine, true},
		{"cb-worker", mtls.Worker, true},
		{" blend", mtls.Blend, true},
		{"gateway", "", false},
		{"", "", false},
		{"cb-", "", false},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := mtls.ParseRole(tc.in)
			if (err == nil) != tc.ok || got != tc.want {
				t.Fatalf("ParseRole(%q) = %q, %v", tc.in, got, err)
			}
		})
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
