package main

import (
	"log/slog"

	"github.com/spf13/pflag"
	"google.golang.org/grpc"

	"github.com/cacheblend/cacheblend/rpc/mtls"
)

// registerTLSFlags adds the mutual-TLS flags of cb engine, cb worker and cb blend to f
// (--tls-cert, --tls-key, --tls-ca; CB_<COMMAND>_TLS_CERT, …): all three turn mutual TLS on
// for every gRPC hop of the process, none leaves it plaintext.
func registerTLSFlags(f *pflag.FlagSet, files *mtls.Files, role mtls.Role) {
	f.StringVar(&files.Cert, "tls-cert", "", "PEM certificate of this process, naming role "+string(role)+
		" in the URI SAN "+role.URI().String()+"; with --tls-key and --tls-ca every gRPC hop is mutual TLS (none of the three: plaintext and unauthenticated)")
	f.StringVar(&files.Key, "tls-key", "", "PEM private key of --tls-cert")
	f.StringVar(&files.CA, "tls-ca", "", "PEM certificate(s) of the CA that signs every process's certificate")
}

// logTLS logs the process's transport security: the identity, or a warning
// that without one its gRPC port (when it has one) admits any caller and
// its calls are unauthenticated.
func logTLS(logger *slog.Logger, id *mtls.Identity, serves bool) {
	switch {
	case id != nil:
		logger.Info("gRPC mutual TLS on", "role", id.Role(), "cert_not_after", id.NotAfter())
	case serves:
		logger.Warn("gRPC port is unauthenticated: no --tls-cert/--tls-key/--tls-ca, so any process that reaches the port can call it and traffic is plaintext")
	default:
		logger.Warn("gRPC calls are plaintext and unauthenticated: no --tls-cert/--tls-key/--tls-ca")
	}
}

// dialOptions are the options of rpc.Dial to a server with role server:
// mutual TLS with id, or none (plaintext) when id is nil.
func dialOptions(id *mtls.Identity, server mtls.Role) []grpc.DialOption {
	if id == nil {
		return nil
	}
	return []grpc.DialOption{id.DialOption(server)}
}

// serverOptions are the gRPC server options of a process with identity id
// that admits callers with the allowed roles, or none (plaintext, everyone
// admitted) when id is nil.
func serverOptions(id *mtls.Identity, allowed ...mtls.Role) []grpc.ServerOption {
	if id == nil {
		return nil
	}
	return id.ServerOptions(allowed...)
}
