package mtls

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
)

// Role names a process of the stack in its certificate.
type Role string

// The roles of the stack's processes, as their service names.
const (
	Engine Role = "cb-engine"
	Worker Role = "cb-worker"
	Blend  Role = "cb-blend"
)

// Roles are the stack's roles, one certificate each (read-only).
var Roles = []Role{Engine, Worker, Blend}

// WorkerCallers are the roles allowed to call cb worker's gRPC services
// (read-only).
var WorkerCallers = []Role{Engine}

// BlendCallers are the roles allowed to call cb blend's gRPC services
// (read-only).
var BlendCallers = []Role{Engine, Worker}

// URIScheme and TrustDomain make up a role's URI SAN:
// spiffe://cacheblend/<role>.
const (
	URIScheme   = "spiffe"
	TrustDomain = "cacheblend"
)

// URI is the URI subject alternative name that names r in a certificate,
// spiffe://cacheblend/<role>.
func (r Role) URI() *url.URL {
	return &url.URL{Scheme: URIScheme, Host: TrustDomain, Path: "/" + string(r)}
}

// String returns the role's name.
func (r Role) String() string { return string(r) }

// Valid reports whether r is one of the stack's roles.
func (r Role) Valid() bool { return slices.Contains(Roles, r) }

// ErrNoRole reports a certificate that names no role, or more than one.
var ErrNoRole = errors.New("mtls: certificate names no single cacheblend role")

// RoleOf returns the role a certificate names: the path of its one URI SAN
// spiffe://cacheblend/<role>. Other URI SANs are ignored; none, two, or a
// role that is not one of Roles is ErrNoRole. The certificate's common name
// is never used.
func RoleOf(cert *x509.Certificate) (Role, error) {
	var found []Role
	for _, u := range cert.URIs {
		if u.Scheme != URIScheme || u.Host != TrustDomain {
			continue
		}
		found = append(found, Role(strings.TrimPrefix(u.Path, "/")))
	}
	if len(found) != 1 {
		return "", fmt.Errorf("%w (%d %s://%s URIs)", ErrNoRole, len(found), URIScheme, TrustDomain)
	}
	if !found[0].Valid() {
		return "", fmt.Errorf("%w (unknown role %q)", ErrNoRole, found[0])
	}
	return found[0], nil
}
