package mtls

import (
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// CAKeyFile is the name of the CA's private key in a directory written by
// WriteCA: the operator's copy, which never leaves the machine that issues
// certificates.
const CAKeyFile = "ca-key.pem"

// ErrExists reports that WriteCA or WriteHost would replace a file that is
// already there.
var ErrExists = errors.New("mtls: file exists")

// WriteCA generates a CA (NewCA) and writes its certificate (CAFile) and
// its key (CAKeyFile, PKCS #8) to dir, created with mode 0700 when missing,
// each file mode 0600. It refuses, with ErrExists, to replace an existing
// CA: a new CA invalidates every certificate the old one issued.
func WriteCA(dir string, validity time.Duration) (*CA, error) {
	for _, name := range []string{CAFile, CAKeyFile} {
		if err := notExists(filepath.Join(dir, name)); err != nil {
			return nil, err
		}
	}
	ca, err := NewCA(validity)
	if err != nil {
		return nil, err
	}
	pk, err := x509.MarshalPKCS8PrivateKey(ca.key)
	if err != nil {
		return nil, fmt.Errorf("mtls: CA key: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("mtls: %w", err)
	}
	// The key first: a directory with ca.pem and no key cannot issue.
	if err := writePrivate(filepath.Join(dir, CAKeyFile), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pk})); err != nil {
		return nil, err
	}
	if err := writePrivate(filepath.Join(dir, CAFile), ca.CertPEM()); err != nil {
		return nil, err
	}
	return ca, nil
}

// LoadCA reads the CA written by WriteCA from dir (CAFile and CAKeyFile)
// and checks that the certificate is a CA's, valid now, and matches the
// key.
func LoadCA(dir string) (*CA, error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, CAFile))
	if err != nil {
		return nil, fmt.Errorf("mtls: CA certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, CAKeyFile))
	if err != nil {
		return nil, fmt.Errorf("mtls: CA key (the CA must have been made by WriteCA, cb certs init): %w", err)
	}
	cb, _ := pem.Decode(certPEM)
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("mtls: %s: no PEM certificate", filepath.Join(dir, CAFile))
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("mtls: %s: %w", filepath.Join(dir, CAFile), err)
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil || kb.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("mtls: %s: no PEM PKCS #8 private key", filepath.Join(dir, CAKeyFile))
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("mtls: %s: %w", filepath.Join(dir, CAKeyFile), err)
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("mtls: %s: a %T key, want ECDSA", filepath.Join(dir, CAKeyFile), k)
	}
	if !key.PublicKey.Equal(cert.PublicKey) {
		return nil, fmt.Errorf("mtls: %s does not match %s", filepath.Join(dir, CAKeyFile), filepath.Join(dir, CAFile))
	}
	if !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, fmt.Errorf("mtls: %s is not a CA certificate", filepath.Join(dir, CAFile))
	}
	if now := time.Now(); now.After(cert.NotAfter) || now.Before(cert.NotBefore) {
		return nil, fmt.Errorf("mtls: CA %s is not valid now (%v to %v)", filepath.Join(dir, CAFile), cert.NotBefore, cert.NotAfter)
	}
	return &CA{cert: cert, key: key, certPEM: certPEM}, nil
}

// ParseRole accepts a role by its name (cb-engine) or short name (engine).
func ParseRole(s string) (Role, error) {
	s = strings.TrimSpace(s)
	r := Role(s)
	if !strings.HasPrefix(s, "cb-") {
		r = Role("cb-" + s)
	}
	if !r.Valid() {
		return "", fmt.Errorf("mtls: unknown role %q (want one of %v, or engine, worker, blend)", s, Roles)
	}
	return r, nil
}

// WriteHost issues a certificate and key for each of roles (CA.Issue with
// hosts as SANs) and writes them with the CA's certificate to dir, the
// files of one host: CAFile, and CertFile and KeyFile per role (DirFiles
// names them), mode 0600 in a directory created 0700. Unless replace is
// set, it refuses with ErrExists when any of these files exists, before
// writing anything. Files of other roles and other hosts are not touched.
func (ca *CA) WriteHost(dir string, roles []Role, hosts []string, validity time.Duration, replace bool) error {
	if len(roles) == 0 {
		return errors.New("mtls: no role to issue")
	}
	files := map[string][]byte{CAFile: ca.CertPEM()}
	names := []string{CAFile}
	for _, r := range roles {
		c, k, err := ca.Issue(r, hosts, validity)
		if err != nil {
			return err
		}
		files[CertFile(r)], files[KeyFile(r)] = c, k
		names = append(names, CertFile(r), KeyFile(r))
	}
	if !replace {
		for _, name := range names {
			if err := notExists(filepath.Join(dir, name)); err != nil {
				return err
			}
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("mtls: %w", err)
	}
	for _, name := range names {
		if err := writePrivate(filepath.Join(dir, name), files[name]); err != nil {
			return err
		}
	}
	return nil
}

// notExists is nil when path does not exist, ErrExists when it does.
func notExists(path string) error {
	_, err := os.Stat(path)
	switch {
	case err == nil:
		return fmt.Errorf("%w: %s", ErrExists, path)
	case errors.Is(err, fs.ErrNotExist):
		return nil
	default:
		return fmt.Errorf("mtls: %w", err)
	}
}
