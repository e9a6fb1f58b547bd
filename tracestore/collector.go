package tracestore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/cacheblend/cacheblend/component"
	"github.com/cacheblend/cacheblend/httpserve"
)

// Default listen addresses of a [Collector].
const (
	DefaultOTLPAddr  = "127.0.0.1:4318"
	DefaultQueryAddr = "127.0.0.1:16686"
)

// Limits of each of a [Collector]'s two HTTP servers (see package httpserve), the
// defaults of the zero fields of [Config].
const (
	DefaultReadHeaderTimeout = httpserve.DefaultReadHeaderTimeout // 10 s
	DefaultReadTimeout       = 60 * time.Second                   // headers and a 16 MiB body
	DefaultWriteTimeout      = httpserve.DefaultWriteTimeout      // 30 s
	DefaultIdleTimeout       = 120 * time.Second                  // exporters keep their connection
	DefaultMaxHeaderBytes    = httpserve.DefaultMaxHeaderBytes    // 64 KiB
	DefaultMaxConns          = httpserve.DefaultMaxConns          // 1024 per server
)

// Config holds the optional settings of a [Collector]. The zero value is usable: the
// standard OTLP/HTTP and Jaeger query ports on the loopback interface, 16 MiB bodies,
// 10000 traces, 1,000,000 spans and 256 MiB of spans (the store's other limits at their
// defaults, see [StoreConfig]), and the Default* HTTP limits above.
type Config struct {
	// OTLPAddr is the OTLP/HTTP listen address; "" means DefaultOTLPAddr. ":0" or
	// "127.0.0.1:0" picks a free port (see [Collector.OTLPAddr]).
	OTLPAddr string
	// QueryAddr is the query API and web page listen address; "" means DefaultQueryAddr.
	QueryAddr string
	// MaxBodyBytes caps an OTLP request body, before and after decompression; 0 means
	// DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// MaxTraces and MaxSpans bound the store; 0 means DefaultMaxTraces / DefaultMaxSpans.
	// A negative limit (here, in MaxBodyBytes or in the HTTP limits below) is an error of
	// [New].
	MaxTraces int
	MaxSpans  int
	// MaxBytes is the store's memory budget (see StoreConfig.MaxBytes); 0 means
	// DefaultMaxBytes. Request bodies are capped at it too.
	MaxBytes int64

	// Limits bound each of the two HTTP servers (see package httpserve); a zero field means
	// the Default* limit above.
	httpserve.Limits
}

// httpLimits returns the limits of each HTTP server, defaults applied.
func (c Config) httpLimits() httpserve.Limits {
	return c.Limits.WithDefaults(httpserve.Limits{
		ReadHeaderTimeout: DefaultReadHeaderTimeout, ReadTimeout: DefaultReadTimeout, WriteTimeout: DefaultWriteTimeout,
		IdleTimeout: DefaultIdleTimeout, MaxHeaderBytes: DefaultMaxHeaderBytes, MaxConns: DefaultMaxConns,
	})
}

var _ component.Lifecycle = (*Collector)(nil)

// Collector is the embedded collector of `cb traces`: an OTLP/HTTP receiver on one port
// (POST /v1/traces) and the Jaeger-compatible query API plus the web page on another, over
// one [Store]. Build it with [New], then Start and Shutdown it (the lifecycle of
// component.Lifecycle). Safe for concurrent use.
type Collector struct {
	cfg    Config
	store  *Store
	recv   *Receiver
	logger *slog.Logger

	mu        sync.Mutex
	started   bool
	shutdown  bool
	servers   []*httpserve.Server
	otlpAddr  string
	queryAddr string
	wg        sync.WaitGroup
	serveErrs []error
}

// New returns a collector for cfg that is not yet listening. Of deps only the Logger is
// used (the HTTP servers' errors); the collector records no spans of its own (they would
// feed back into it) and registers no metrics (its counters are [Store.Stats] and
// [Receiver.Stats]). A negative limit is an error.
func New(cfg Config, deps component.Deps) (*Collector, error) {
	if cfg.MaxBodyBytes < 0 || cfg.MaxTraces < 0 || cfg.MaxSpans < 0 || cfg.ReadHeaderTimeout < 0 || cfg.ReadTimeout < 0 ||
		cfg.WriteTimeout < 0 || cfg.IdleTimeout < 0 || cfg.MaxHeaderBytes < 0 || cfg.MaxConns < 0 {
		return nil, fmt.Errorf("tracestore: negative limit in %+v", cfg)
	}
	cfg.OTLPAddr = cmp.Or(cfg.OTLPAddr, DefaultOTLPAddr)
	cfg.QueryAddr = cmp.Or(cfg.QueryAddr, DefaultQueryAddr)
	store := NewStore(StoreConfig{MaxTraces: cfg.MaxTraces, MaxSpans: cfg.MaxSpans, MaxBytes: cfg.MaxBytes})
	return &Collector{
		cfg:    cfg,
		store:  store,
		recv:   NewReceiver(store, ReceiverConfig{MaxBodyBytes: cfg.MaxBodyBytes}),
		logger: deps.WithDefaults().Logger,
	}, nil
}

// Store returns the collector's trace store.
func (c *Collector) Store() *Store { return c.store }

// Receiver returns the collector's OTLP receiver (for its counters).
func (c *Collector) Receiver() *Receiver { return c.recv }

// OTLPHandler returns the handler of the OTLP port: POST /v1/traces.
func (c *Collector) OTLPHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/v1/traces", c.recv)
	return mux
}

// QueryHandler returns the handler of the query port (see [NewQueryHandler]).
func (c *Collector) QueryHandler() http.Handler { return NewQueryHandler(c.store, c.recv) }

// Start binds both listeners and serves them in the background until [Collector.Shutdown].
// It fails if a port cannot be bound (nothing is left listening then) or if the collector
// was already started or shut down. ctx bounds only the binding.
func (c *Collector) Start(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started || c.shutdown {
		return errors.New("tracestore: collector already started or shut down")
	}
	var lc net.ListenConfig
	otlpLn, err := lc.Listen(ctx, "tcp", c.cfg.OTLPAddr)
	if err != nil {
		return fmt.Errorf("tracestore: listen OTLP on %s: %w", c.cfg.OTLPAddr, err)
	}
	queryLn, err := lc.Listen(ctx, "tcp", c.cfg.QueryAddr)
	if err != nil {
		otlpLn.Close()
		return fmt.Errorf("tracestore: listen query on %s: %w", c.cfg.QueryAddr, err)
	}
	c.started = true
	c.otlpAddr, c.queryAddr = otlpLn.Addr().String(), queryLn.Addr().String()
	for _, p := range []struct {
		name string
		ln   net.Listener
		h    http.Handler
	}{{"otlp", otlpLn, c.OTLPHandler()}, {"query", queryLn, c.QueryHandler()}} {
		srv := httpserve.New(p.name, p.h, c.cfg.httpLimits(), c.logger)
		c.servers = append(c.servers, srv)
		c.wg.Add(1)
		go func(ln net.Listener) {
			defer c.wg.Done()
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				c.logger.Error("trace collector server stopped", "addr", ln.Addr().String(), "err", err)
				c.mu.Lock()
				c.serveErrs = append(c.serveErrs, err)
				c.mu.Unlock()
			}
		}(p.ln)
	}
	return nil
}

// OTLPAddr returns the bound OTLP address (host:port) once started, else the configured one.
func (c *Collector) OTLPAddr() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return cmp.Or(c.otlpAddr, c.cfg.OTLPAddr)
}

// QueryAddr returns the bound query address (host:port) once started, else the configured
// one.
func (c *Collector) QueryAddr() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return cmp.Or(c.queryAddr, c.cfg.QueryAddr)
}

// Shutdown stops accepting connections, waits for in-flight requests until ctx is done,
// then closes what is left and waits for the serving goroutines. It returns the errors of
// the shutdown and of serving, joined. Safe to call more than once (later calls return
// nil) and before Start; the collector cannot be started again.
func (c *Collector) Shutdown(ctx context.Context) error {
	c.mu.Lock()
	c.shutdown = true
	servers := c.servers
	c.servers = nil
	c.mu.Unlock()
	var errs []error
	for _, srv := range servers {
		if err := srv.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("tracestore: shutdown: %w", err))
			_ = srv.Close()
		}
	}
	c.wg.Wait()
	c.mu.Lock()
	errs = append(errs, c.serveErrs...)
	c.serveErrs = nil
	c.mu.Unlock()
	return errors.Join(errs...)
}
