package mtls

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// Files names the PEM files of one process's identity. All three are set
// (mutual TLS) or none is (plaintext).
type Files struct {
	// Cert is the process's certificate, optionally followed by
	// intermediate CA certificates.
	Cert string
	// Key is the certificate's private key (PKCS #8, PKCS #1 or SEC 1).
	Key string
	// CA holds the certificates of the CA(s) a peer's certificate must
	// chain to.
	CA string
}

// Enabled reports whether any file is set.
func (f Files) Enabled() bool { return f.Cert != "" || f.Key != "" || f.CA != "" }

// Validate reports an error unless all three files or none are set.
func (f Files) Validate() error {
	if !f.Enabled() || (f.Cert != "" && f.Key != "" && f.CA != "") {
		return nil
	}
	var missing []string
	for _, m := range []struct{ name, v string }{{"certificate", f.Cert}, {"key", f.Key}, {"CA", f.CA}} {
		if m.v == "" {
			missing = append(missing, m.name)
		}
	}
	return fmt.Errorf("mtls: incomplete TLS configuration: no %v file (give the certificate, its key and the CA, or none of them)", missing)
}

// Identity is a loaded certificate with its key, its role and the CA pool
// peers are verified against. It is immutable and safe for concurrent use.
type Identity struct {
	role  Role
	cert  tls.Certificate
	roots *x509.CertPool
}

// Load reads f and checks that the certificate matches its key, chains to
// the CA, is valid now, may serve as both TLS server and client, and names
// role: a process refuses to start with another process's certificate.
func Load(f Files, role Role) (*Identity, error) {
	if !f.Enabled() {
		return nil, errors.New("mtls: no certificate files")
	}
	if err := f.Validate(); err != nil {
		return nil, err
	}
	caPEM, err := os.ReadFile(f.CA)
	if err != nil {
		return nil, fmt.Errorf("mtls: CA: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("mtls: CA %s: no PEM certificate", f.CA)
	}
	cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return nil, fmt.Errorf("mtls: %w", err)
	}
	return newIdentity(cert, roots, role, f.Cert)
}

// newIdentity checks cert (see Load) and returns its Identity; name is the
// certificate's source in errors.
func newIdentity(cert tls.Certificate, roots *x509.CertPool, role Role, name string) (*Identity, error) {
	leaf := cert.Leaf
	if leaf == nil {
		var err error
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, fmt.Errorf("mtls: %s: %w", name, err)
		}
		cert.Leaf = leaf
	}
	got, err := RoleOf(leaf)
	if err != nil {
		return nil, fmt.Errorf("mtls: %s: %w", name, err)
	}
	if got != role {
		return nil, fmt.Errorf("mtls: %s names role %s, this process is %s", name, got, role)
	}
	inter := x509.NewCertPool()
	for _, der := range cert.Certificate[1:] {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, fmt.Errorf("mtls: %s: intermediate: %w", name, err)
		}
		inter.AddCert(c)
	}
	for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		if _, err := leaf.Verify(x509.VerifyOptions{
			Roots: roots, Intermediates: inter, CurrentTime: time.Now(), KeyUsages: []x509.ExtKeyUsage{usage},
		}); err != nil {
			return nil, fmt.Errorf("mtls: %s does not verify against the CA (it must be signed by it, be valid now and allow TLS server and client use): %w", name, err)
		}
	}
	return &Identity{role: role, cert: cert, roots: roots}, nil
}

// Role is the role the identity's certificate names.
func (id *Identity) Role() Role { return id.role }

// NotAfter is when the identity's certificate expires.
func (id *Identity) NotAfter() time.Time { return id.cert.Leaf.NotAfter }

// ServerTLS returns the TLS configuration of a server: TLS 1.3 only, this
// identity's certificate, and a client certificate required and verified
// against the CA. Which roles may call is checked per call by the
// interceptors (ServerOptions).
func (id *Identity) ServerTLS() *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{id.cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    id.roots,
	}
}

// ClientTLS returns the TLS configuration of a client of a server with role
// server: TLS 1.3 only, this identity's certificate presented, the server's
// certificate verified against the CA and the dialled host name (gRPC sets
// ServerName from the target's host), then required to name role server.
func (id *Identity) ClientTLS(server Role) *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{id.cert},
		RootCAs:      id.roots,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("mtls: server presented no certificate")
			}
			got, err := RoleOf(cs.PeerCertificates[0])
			if err != nil {
				return fmt.Errorf("mtls: server certificate: %w", err)
			}
			if got != server {
				return fmt.Errorf("mtls: server certificate names role %s, want %s", got, server)
			}
			return nil
		},
	}
}

// ServerOptions returns the options that make a gRPC server (rpc.NewServer)
// serve mutual TLS with this identity and accept calls only from the
// allowed roles (WorkerCallers, BlendCallers), on every unary and streaming
// method.
func (id *Identity) ServerOptions(allowed ...Role) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.Creds(credentials.NewTLS(id.ServerTLS())),
		grpc.ChainUnaryInterceptor(UnaryServerInterceptor(allowed...)),
		grpc.ChainStreamInterceptor(StreamServerInterceptor(allowed...)),
	}
}

// DialOption returns the option that makes a gRPC client (rpc.Dial) speak
// mutual TLS with this identity to a server with role server.
func (id *Identity) DialOption(server Role) grpc.DialOption {
	return grpc.WithTransportCredentials(credentials.NewTLS(id.ClientTLS(server)))
}
