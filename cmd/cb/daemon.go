package main

import (
	"context"

	"github.com/spf13/pflag"

	"github.com/cacheblend/cacheblend/httpfront"
	"github.com/cacheblend/cacheblend/httpserve"
	"github.com/cacheblend/cacheblend/modelfile"
	"github.com/cacheblend/cacheblend/rpc"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
	"github.com/cacheblend/cacheblend/rpc/mtls"
	"github.com/cacheblend/cacheblend/service"
)

// daemonFlags are the flags cb engine, worker, blend and gateway share: the OTLP traces
// endpoint and, with gRPC hops (a role), the TLS flags.
type daemonFlags struct {
	otlp string
	tls  mtls.Files
	role mtls.Role // "": no TLS flags
}

// register adds the flags to f; role "" leaves the TLS flags out.
func (d *daemonFlags) register(f *pflag.FlagSet, role mtls.Role) {
	f.StringVar(&d.otlp, "otlp-traces-endpoint", "", "OTLP traces endpoint (overrides OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)")
	if d.role = role; role != "" {
		registerTLSFlags(f, &d.tls, role)
	}
}

// start loads the TLS identity (nil without TLS flags set), starts the service runtime and
// logs the transport security (serves: the process has a gRPC port).
func (d *daemonFlags) start(ctx context.Context, name, addr string, serves bool) (*service.Runtime, *mtls.Identity, error) {
	var id *mtls.Identity
	if d.role != "" && d.tls.Enabled() {
		var err error
		if id, err = mtls.Load(d.tls, d.role); err != nil {
			return nil, nil, err
		}
	}
	rt, err := service.New(ctx, service.Options{ServiceName: name, OTLPEndpoint: d.otlp, InstanceID: service.InstanceID(addr)})
	if err != nil {
		return nil, nil, err
	}
	if d.role != "" {
		logTLS(rt.Logger, id, serves)
	}
	return rt, id, nil
}

// dialBlend returns a client of the blend server at addr ("": none) and its close.
func dialBlend(addr string, id *mtls.Identity) (cbv1.BlendServiceClient, func(), error) {
	if addr == "" {
		return nil, func() {}, nil
	}
	conn, err := rpc.Dial(addr, dialOptions(id, mtls.Blend)...)
	if err != nil {
		return nil, nil, err
	}
	return cbv1.NewBlendServiceClient(conn), func() { _ = conn.Close() }, nil
}

// openModelFile opens the GGUF model file at path ("": none, the built-in model) and returns
// it with its close.
func openModelFile(path string) (*modelfile.File, func(), error) {
	if path == "" {
		return nil, func() {}, nil
	}
	mf, err := modelfile.Open(path)
	if err != nil {
		return nil, nil, err
	}
	return mf, func() { _ = mf.Close() }, nil
}

// registerFrontFlags adds the API front's flags that cb engine and cb gateway share to f.
func registerFrontFlags(f *pflag.FlagSet, s *httpfront.Settings) {
	f.StringVar(&s.APIKey, "api-key", "", "require this bearer key on /v1/* (empty: no auth)")
	f.Int64Var(&s.MaxBodyBytes, "max-body-bytes", httpfront.DefaultMaxBodyBytes, "largest request body (413 beyond)")
	f.IntVar(&s.MaxConns, "max-conns", httpfront.DefaultMaxConns, "connections held at once; at the cap the oldest idle or still-sending one is closed, or the new one refused when all are being served")
	f.DurationVar(&s.ReadHeaderTimeout, "read-header-timeout", httpserve.DefaultReadHeaderTimeout, "time to send a request's headers")
	f.DurationVar(&s.ReadTimeout, "read-timeout", httpserve.DefaultReadTimeout, "time to send a whole request, headers and body (408 beyond)")
	f.DurationVar(&s.WriteTimeout, "write-timeout", httpserve.DefaultWriteTimeout, "time a client may take to accept each write of a response (renewed per write: streams are not cut)")
	f.DurationVar(&s.IdleTimeout, "idle-timeout", httpserve.DefaultIdleTimeout, "close a keep-alive connection idle this long")
}
