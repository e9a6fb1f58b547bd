package mtlstest

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/rpc/mtls"
)

// Identities writes a fresh CA and every role's certificate under tb's
// temporary directory and returns a function loading role r's identity
// from it (tb.Fatal on any error). Safe for concurrent use once returned.
func Identities(tb testing.TB) func(r mtls.Role) *mtls.Identity {
	tb.Helper()
	dir := filepath.Join(tb.TempDir(), "tls")
	if err := mtls.WriteDir(dir, mtls.DefaultHosts, time.Hour); err != nil {
		tb.Fatal(err)
	}
	return func(r mtls.Role) *mtls.Identity {
		tb.Helper()
		id, err := Load(dir, r)
		if err != nil {
			tb.Fatal(err)
		}
		return id
	}
}

// Load loads role r's identity from dir (a directory mtls.WriteDir or
// `cb certs` wrote).
func Load(dir string, r mtls.Role) (*mtls.Identity, error) {
	return mtls.Load(mtls.DirFiles(dir, r), r)
}
