package mtls_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/rpc/mtls"
)

func parsePEM(t *testing.T, b []byte) *x509.Certificate {
	t.Helper()
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		t.Fatalf("not a PEM certificate: %q", b)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestIssue(t *testing.T) {
	ca, err := mtls.NewCA(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	caCert := ca.Certificate()
	if !caCert.IsCA || !caCert.MaxPathLenZero || caCert.KeyUsage&x509.KeyUsageCertSign == 0 {
		t.Fatalf("CA certificate: IsCA=%v MaxPathLenZero=%v KeyUsage=%v", caCert.IsCA, caCert.MaxPathLenZero, caCert.KeyUsage)
	}
	certPEM, keyPEM, err := ca.Issue(mtls.Worker, append([]string{"worker.example"}, mtls.DefaultHosts...), 2*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	c := parsePEM(t, certPEM)
	if pub, ok := c.PublicKey.(*ecdsa.PublicKey); !ok || pub.Curve != elliptic.P256() {
		t.Errorf("public key %T, want ECDSA P-256", c.PublicKey)
	}
	if role, err := mtls.RoleOf(c); err != nil || role != mtls.Worker {
		t.Errorf("RoleOf = %q, %v", role, err)
	}
	if len(c.URIs) != 1 || c.URIs[0].String() != "spiffe://cacheblend/cb-worker" {
		t.Errorf("URIs %v", c.URIs)
	}
	if c.Subject.CommonName != "cb-worker" {
		t.Errorf("CN %q", c.Subject.CommonName)
	}
	if !slices.Equal(c.DNSNames, []string{"worker.example", "localhost"}) {
		t.Errorf("DNS SANs %v", c.DNSNames)
	}
	var ips []string
	for _, ip := range c.IPAddresses {
		ips = append(ips, ip.String())
	}
	if !slices.Equal(ips, []string{"127.0.0.1", "::1"}) {
		t.Errorf("IP SANs %v", ips)
	}
	if !slices.Equal(c.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}) {
		t.Errorf("EKU %v", c.ExtKeyUsage)
	}
	// Cut to the CA's expiry, never longer than asked.
	if c.NotAfter.After(caCert.NotAfter) || c.NotAfter.After(time.Now().Add(2*time.Hour)) {
		t.Errorf("NotAfter %v, CA's %v", c.NotAfter, caCert.NotAfter)
	}
	if !c.NotBefore.Before(time.Now()) {
		t.Errorf("NotBefore %v is not in the past", c.NotBefore)
	}
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	for _, h := range []string{"127.0.0.1", "::1", "localhost", "worker.example"} {
		if _, err := c.Verify(x509.VerifyOptions{Roots: pool, DNSName: h}); err != nil {
			t.Errorf("verify for %s: %v", h, err)
		}
	}
	if _, err := c.Verify(x509.VerifyOptions{Roots: pool, DNSName: "10.1.2.3"}); err == nil {
		t.Error("verified for a host not in its SANs")
	}
	if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
		t.Errorf("key pair: %v", err)
	}
	if !strings.Contains(string(keyPEM), "BEGIN PRIVATE KEY") {
		t.Errorf("key is not PKCS #8 PEM")
	}

	if _, _, err := ca.Issue("cb-other", nil, time.Hour); err == nil {
		t.Error("issued a certificate for an unknown role")
	}
	if _, _, err := ca.Issue(mtls.Engine, nil, 0); err == nil {
		t.Error("issued a certificate with zero validity")
	}
	if _, err := mtls.NewCA(0); err == nil {
		t.Error("made a CA with zero validity")
	}
}

func TestWriteDirAndLoad(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	if err := mtls.WriteDir(dir, mtls.DefaultHosts, time.Hour); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("dir mode %v, %v", fi.Mode(), err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
		fi, _ := e.Info()
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", e.Name(), fi.Mode().Perm())
		}
	}
	want := []string{"ca.pem", "cb-blend-key.pem", "cb-blend.pem", "cb-engine-key.pem", "cb-engine.pem", "cb-worker-key.pem", "cb-worker.pem"}
	if !slices.Equal(names, want) {
		t.Fatalf("files %v, want %v (no CA key, no temporary files)", names, want)
	}
	for _, r := range mtls.Roles {
		id, err := mtls.Load(mtls.DirFiles(dir, r), r)
		if err != nil {
			t.Fatalf("load %s: %v", r, err)
		}
		if id.Role() != r || time.Until(id.NotAfter()) > time.Hour {
			t.Errorf("%s: role %s, not after %v", r, id.Role(), id.NotAfter())
		}
	}

	// Another process's certificate is refused.
	if _, err := mtls.Load(mtls.DirFiles(dir, mtls.Worker), mtls.Engine); err == nil || !strings.Contains(err.Error(), "names role cb-worker") {
		t.Errorf("load the worker's certificate as the engine: %v", err)
	}
	// A certificate of another CA is refused.
	other := filepath.Join(t.TempDir(), "other")
	if err := mtls.WriteDir(other, mtls.DefaultHosts, time.Hour); err != nil {
		t.Fatal(err)
	}
	f := mtls.DirFiles(dir, mtls.Engine)
	f.CA = filepath.Join(other, mtls.CAFile)
	if _, err := mtls.Load(f, mtls.Engine); err == nil || !strings.Contains(err.Error(), "does not verify") {
		t.Errorf("load with another CA: %v", err)
	}
	// A key that does not match.
	f = mtls.DirFiles(dir, mtls.Engine)
	f.Key = filepath.Join(dir, mtls.KeyFile(mtls.Blend))
	if _, err := mtls.Load(f, mtls.Engine); err == nil {
		t.Error("loaded a certificate with another certificate's key")
	}
	// Missing and partial configurations.
	if _, err := mtls.Load(mtls.Files{Cert: "/nonexistent.pem", Key: "/nonexistent.pem", CA: "/nonexistent.pem"}, mtls.Engine); err == nil {
		t.Error("loaded missing files")
	}
	if _, err := mtls.Load(mtls.Files{}, mtls.Engine); err == nil {
		t.Error("loaded no files")
	}
	// Regenerating replaces the files.
	before, _ := os.ReadFile(filepath.Join(dir, mtls.CAFile))
	if err := mtls.WriteDir(dir, nil, time.Hour); err != nil {
		t.Fatal(err)
	}
	after, _ := os.ReadFile(filepath.Join(dir, mtls.CAFile))
	if string(before) == string(after) {
		t.Error("WriteDir did not replace the CA")
	}
}

func TestLoadExpired(t *testing.T) {
	ca, err := mtls.NewCA(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	c, k, err := ca.Issue(mtls.Blend, mtls.DefaultHosts, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	f := mtls.Files{Cert: filepath.Join(dir, "c.pem"), Key: filepath.Join(dir, "k.pem"), CA: filepath.Join(dir, "ca.pem")}
	for p, b := range map[string][]byte{f.Cert: c, f.Key: k, f.CA: ca.CertPEM()} {
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(5 * time.Millisecond)
	if _, err := mtls.Load(f, mtls.Blend); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Errorf("loaded an expired certificate: %v", err)
	}
}

func TestFilesValidate(t *testing.T) {
	for _, tc := range []struct {
		f       mtls.Files
		enabled bool
		ok      bool
	}{
		{mtls.Files{}, false, true},
		{mtls.Files{Cert: "c", Key: "k", CA: "a"}, true, true},
		{mtls.Files{Cert: "c"}, true, false},
		{mtls.Files{Cert: "c", Key: "k"}, true, false},
		{mtls.Files{CA: "a"}, true, false},
	} {
		if got := tc.f.Enabled(); got != tc.enabled {
			t.Errorf("%+v: Enabled = %v", tc.f, got)
		}
		if err := tc.f.Validate(); (err == nil) != tc.ok {
			t.Errorf("%+v: Validate = %v", tc.f, err)
		}
	}
}

func TestRoleOf(t *testing.T) {
	ca, err := mtls.NewCA(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	c, _, err := ca.Issue(mtls.Engine, []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert := parsePEM(t, c)
	if r, err := mtls.RoleOf(cert); err != nil || r != mtls.Engine {
		t.Fatalf("RoleOf = %q, %v", r, err)
	}
	// The common name alone does not name a role.
	noURI := *cert
	noURI.URIs = nil
	if _, err := mtls.RoleOf(&noURI); err == nil {
		t.Error("role from the common name")
	}
	two := *cert
	two.URIs = append(two.URIs, mtls.Blend.URI())
	if _, err := mtls.RoleOf(&two); err == nil {
		t.Error("a certificate naming two roles has a role")
	}
	unknown := *cert
	unknown.URIs = []*url.URL{mtls.Role("cb-admin").URI()}
	if _, err := mtls.RoleOf(&unknown); err == nil {
		t.Error("unknown role accepted")
	}
	other := *cert
	other.URIs = []*url.URL{{Scheme: "spiffe", Host: "elsewhere", Path: "/cb-engine"}}
	if _, err := mtls.RoleOf(&other); err == nil {
		t.Error("role from another trust domain")
	}
}
