package rpc

import (
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/cacheblend/cacheblend/telemetry"
)

// MaxMessageBytes bounds one CacheBlend RPC message (a step batch, a
// lookup's token list), both ways.
const MaxMessageBytes = 64 << 20

// Dial returns a client connection to a cacheblend process at addr
// (host:port) that carries the caller's trace context in gRPC metadata and
// allows MaxMessageBytes messages. It starts connecting at once (the first
// call does not pay the TCP and TLS handshakes), never goes idle (gRPC's
// default closes a connection unused for 30 minutes, and the next call would
// pay the handshakes again), and reconnects after the peer restarts, with a
// backoff bounded
// by ConnectMaxDelay, and at once when a call fails with Unavailable (see
// redialer): a restarted peer is served again within about a second.
//
// It is plaintext unless opts carry transport credentials, which replace
// the plaintext default (options apply in order): pass
// mtls.Identity.DialOption(role of the server) for mutual TLS, as every
// process started with --tls-cert/--tls-key/--tls-ca does.
func Dial(addr string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	rd := &redialer{}
	base := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(connectParams),
		grpc.WithIdleTimeout(0),
		grpc.WithChainUnaryInterceptor(telemetry.UnaryClientInterceptor(), rd.unary),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageBytes), grpc.MaxCallSendMsgSize(MaxMessageBytes)),
	}
	conn, err := grpc.NewClient(addr, append(base, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("rpc: dial %s: %w", addr, err)
	}
	conn.Connect()
	return conn, nil
}

// NewServer returns a gRPC server that extracts the caller's trace context
// from gRPC metadata and accepts MaxMessageBytes messages. It is plaintext
// and admits every caller unless opts say otherwise: with
// mtls.Identity.ServerOptions(allowed roles...) it serves mutual TLS only
// and refuses callers whose certificate names another role (interceptors
// in opts run after the trace-context one).
func NewServer(opts ...grpc.ServerOption) *grpc.Server {
	base := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(MaxMessageBytes), grpc.MaxSendMsgSize(MaxMessageBytes),
		grpc.ChainUnaryInterceptor(telemetry.UnaryServerInterceptor()),
	}
	return grpc.NewServer(append(base, opts...)...)
}
