package mtls

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// DefaultHosts are the host names every generated certificate is valid
// for: the loopback addresses and localhost.
var DefaultHosts = []string{"127.0.0.1", "::1", "localhost"}

// clockSkew backdates NotBefore so that a peer whose clock is slightly
// behind accepts a certificate made a moment ago.
const clockSkew = 5 * time.Minute

// CA is a certificate authority held in memory: an ECDSA P-256 key and a
// self-signed CA certificate. Its key is never written anywhere; a
// throw-away CA can issue certificates only while its process holds it.
type CA struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	certPEM []byte
}

// NewCA generates a CA valid from now for validity (> 0), allowed to sign
// leaf certificates only (path length 0).
func NewCA(validity time.Duration) (*CA, error) {
	if validity <= 0 {
		return nil, errors.New("mtls: CA validity must be positive")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("mtls: CA key: %w", err)
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{"cacheblend"}, CommonName: "cacheblend CA " + now.UTC().Format(time.RFC3339)},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("mtls: CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("mtls: CA certificate: %w", err)
	}
	return &CA{cert: cert, key: key, certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// Certificate is the CA's certificate.
func (ca *CA) Certificate() *x509.Certificate { return ca.cert }

// CertPEM is the CA's certificate, PEM-encoded (the --tls-ca file).
func (ca *CA) CertPEM() []byte { return ca.certPEM }

// Issue generates a key (ECDSA P-256) and a certificate for role signed by
// the CA, valid from now for validity (cut to the CA's own expiry) as TLS
// server and client, with the role's URI SAN (Role.URI), the role as common
// name, and hosts (IP addresses or DNS names, e.g. DefaultHosts) as IP/DNS
// SANs. It returns both PEM-encoded; the key as PKCS #8.
func (ca *CA) Issue(role Role, hosts []string, validity time.Duration) (certPEM, keyPEM []byte, err error) {
	if !role.Valid() {
		return nil, nil, fmt.Errorf("mtls: unknown role %q", role)
	}
	if validity <= 0 {
		return nil, nil, errors.New("mtls: certificate validity must be positive")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("mtls: key: %w", err)
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	notAfter := now.Add(validity)
	if notAfter.After(ca.cert.NotAfter) {
		notAfter = ca.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{Organization: []string{"cacheblend"}, CommonName: string(role)},
		NotBefore:    now.Add(-clockSkew),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:         []*url.URL{role.URI()},
	}
	for _, h := range hosts {
		switch ip := net.ParseIP(h); {
		case ip != nil:
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		case h != "":
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, nil, fmt.Errorf("mtls: certificate for %s: %w", role, err)
	}
	pk, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("mtls: key for %s: %w", role, err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pk}), nil
}

// serialNumber is a random 128-bit certificate serial number.
func serialNumber() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("mtls: serial number: %w", err)
	}
	return n.Add(n, big.NewInt(1)), nil
}

// CAFile is the name of the CA certificate in a WriteDir directory.
const CAFile = "ca.pem"

// CertFile and KeyFile are the names of role's certificate and key in a
// WriteDir directory: <role>.pem and <role>-key.pem.
func CertFile(role Role) string { return string(role) + ".pem" }

// KeyFile is the name of role's private key in a WriteDir directory.
func KeyFile(role Role) string { return string(role) + "-key.pem" }

// DirFiles returns the Files of role in a directory written by WriteDir.
func DirFiles(dir string, role Role) Files {
	return Files{
		Cert: filepath.Join(dir, CertFile(role)),
		Key:  filepath.Join(dir, KeyFile(role)),
		CA:   filepath.Join(dir, CAFile),
	}
}

// WriteDir generates a CA and one certificate per role (see NewCA and
// CA.Issue; hosts are added to every certificate's SANs) and writes them to
// dir, created with mode 0700 when missing: ca.pem, and <role>.pem and
// <role>-key.pem per role (DirFiles names them), each written atomically
// with mode 0600. The CA's key is not written: to issue another
// certificate, run it again and redistribute all files. Existing files of
// these names are replaced.
func WriteDir(dir string, hosts []string, validity time.Duration) error {
	ca, err := NewCA(validity)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("mtls: %w", err)
	}
	files := map[string][]byte{CAFile: ca.CertPEM()}
	for _, r := range Roles {
		c, k, err := ca.Issue(r, hosts, validity)
		if err != nil {
			return err
		}
		files[CertFile(r)], files[KeyFile(r)] = c, k
	}
	for name, b := range files {
		if err := writePrivate(filepath.Join(dir, name), b); err != nil {
			return err
		}
	}
	return nil
}

// writePrivate writes b to path atomically with mode 0600: a temporary file
// (created 0600) renamed over path.
func writePrivate(path string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".cb-tls-*")
	if err != nil {
		return fmt.Errorf("mtls: %w", err)
	}
	_, werr := tmp.Write(b)
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr, os.Chmod(tmp.Name(), 0o600)); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("mtls: write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("mtls: write %s: %w", path, err)
	}
	return nil
}
