package tracestore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"
)

// Default listen addresses of a [Collector].
const (
	DefaultOTLPAddr  = "127.0.0.1:4318"
	DefaultQueryAddr = "127.0.0.1:16686"
)

// Config holds the optional settings of a [Collector]. The zero value is usable: the
// standard OTLP/HTTP and Jaeger query ports on the loopback interface, 16 MiB bodies,
// 10000 traces, 1,000,000 spans and 256 MiB of spans (the store's other limits at their
// defaults, see [StoreConfig]).
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
	MaxTraces int
	MaxSpans  int
	// MaxBytes is the store's memory budget (see StoreConfig.MaxBytes); 0 means
	// DefaultMaxBytes. Request bodies are capped at it too.
	MaxBytes int64
}

// Collector is the embedded collector of `cb traces`: an OTLP/HTTP receiver on one port
// (POST /v1/traces) and the Jaeger-compatible query API plus the web page on another, over
// one [Store]. Start it once and Shut it down once. Safe for concurrent use.
type Collector struct {
	cfg   Config
	store *Store
	recv  *Receiver

	mu        sync.Mutex
	started   bool
	servers   []*http.Server
	otlpAddr  string
	queryAddr string
	wg        sync.WaitGroup
	serveErrs []error
}

// New returns a collector that is not yet listening.
func New(cfg Config) *Collector {
	if cfg.OTLPAddr == "" {
		cfg.OTLPAddr = DefaultOTLPAddr
	}
	if cfg.QueryAddr == "" {
		cfg.QueryAddr = DefaultQueryAddr
	}
	store := NewStore(StoreConfig{MaxTraces: cfg.MaxTraces, MaxSpans: cfg.MaxSpans, MaxBytes: cfg.MaxBytes})
	return &Collector{
		cfg:   cfg,
		store: store,
		recv:  NewReceiver(store, ReceiverConfig{MaxBodyBytes: cfg.MaxBodyBytes}),
	}
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
// was already started. ctx bounds only the binding.
func (c *Collector) Start(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started {
		return errors.New("tracestore: collector already started")
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
		ln net.Listener
		h  http.Handler
	}{{otlpLn, c.OTLPHandler()}, {queryLn, c.QueryHandler()}} {
		srv := &http.Server{
			Handler:           p.h,
			ReadHeaderTimeout: 10 * time.Second,
			ReadTimeout:       60 * time.Second,
			IdleTimeout:       120 * time.Second,
			MaxHeaderBytes:    1 << 20,
		}
		c.servers = append(c.servers, srv)
		c.wg.Add(1)
		go func(ln net.Listener) {
			defer c.wg.Done()
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
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
	if c.otlpAddr != "" {
		return c.otlpAddr
	}
	return c.cfg.OTLPAddr
}

// QueryAddr returns the bound query address (host:port) once started, else the configured
// one.
func (c *Collector) QueryAddr() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.queryAddr != "" {
		return c.queryAddr
	}
	return c.cfg.QueryAddr
}

// Shutdown stops accepting connections, waits for in-flight requests until ctx is done,
// then closes what is left and waits for the serving goroutines. It returns the first
// error of the shutdown or of serving. Safe to call more than once and before Start.
func (c *Collector) Shutdown(ctx context.Context) error {
	c.mu.Lock()
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
