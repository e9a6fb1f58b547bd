// Package httpserve runs the stack's HTTP servers with bounded resources, so
// that a client on the same host cannot exhaust a process's file handles,
// goroutines or memory by opening connections and never finishing a request:
// the engine's OpenAI API, the trace collector's OTLP receiver and query page,
// and every process's /metrics and /health server (package service).
//
// A [Server] is a net/http server with [Limits]: a header timeout, a timeout
// for the whole request (headers and body), a write timeout, an idle timeout
// for keep-alive connections, a header size cap, and a cap on the connections
// it holds. At the cap a new connection takes the place of the oldest one
// that is idle or still sending its request (it is closed, counted as
// evicted); when every held connection is past its request body (being
// served), the new one is refused at once (closed with a reset, counted).
// A client that sends slowly therefore never locks others out, and a request
// being served is never cut.
//
// The write timeout is a deadline from the end of the request headers. A
// handler that streams, or that computes longer than WriteTimeout before it
// writes, extends it before each write with
// http.ResponseController.SetWriteDeadline (as the engine does); the server
// clears it after each response. The read timeout is lifted by net/http once
// the body has been read to its end, so it never cuts a long response.
package httpserve

import (
	"container/list"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of the zero fields of [Limits], unless the component passes its
// own to [Limits.WithDefaults].
const (
	// DefaultReadHeaderTimeout bounds reading a request's headers, and a new
	// connection's wait for them.
	DefaultReadHeaderTimeout = 10 * time.Second
	// DefaultReadTimeout bounds reading a whole request, headers and body.
	DefaultReadTimeout = 30 * time.Second
	// DefaultWriteTimeout bounds writing a response (see the package
	// comment for streams).
	DefaultWriteTimeout = 30 * time.Second
	// DefaultIdleTimeout bounds a keep-alive connection's wait for its next
	// request.
	DefaultIdleTimeout = 60 * time.Second
	// DefaultMaxHeaderBytes bounds a request's header block (net/http adds
	// 4 KiB of slack).
	DefaultMaxHeaderBytes = 64 << 10
	// DefaultMaxConns caps the connections a server holds at once.
	DefaultMaxConns = 1024
)

// Limits bound one HTTP server. A zero field takes the default given to
// [Limits.WithDefaults] (the package's Default* constants when that is zero
// too); negative values count as zero.
type Limits struct {
	// ReadHeaderTimeout bounds reading a request's headers; a new connection
	// that sends no complete header block within it is closed.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a whole request, from its first byte to the
	// end of its body. A handler still reading the body then gets a timeout
	// error (the engine answers 408); the connection is closed after the
	// response.
	ReadTimeout time.Duration
	// WriteTimeout bounds writing a response, counted from the end of the
	// request headers; a handler may extend it (see the package comment).
	WriteTimeout time.Duration
	// IdleTimeout bounds a keep-alive connection's wait for its next
	// request; the connection is closed after it.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's header block (431 beyond).
	MaxHeaderBytes int
	// MaxConns caps the connections held at once (see the package comment
	// for what happens at the cap). It is lowered to half the process's
	// open-file limit when that is smaller, so the server alone can never
	// exhaust the process's file handles.
	MaxConns int
}

// WithDefaults returns l with each zero (or negative) field taken from def,
// and then from the package's Default* constants.
func (l Limits) WithDefaults(def Limits) Limits {
	pickD := func(v, d, dd time.Duration) time.Duration {
		switch {
		case v > 0:
			return v
		case d > 0:
			return d
		}
		return dd
	}
	pickI := func(v, d, dd int) int {
		switch {
		case v > 0:
			return v
		case d > 0:
			return d
		}
		return dd
	}
	return Limits{
		ReadHeaderTimeout: pickD(l.ReadHeaderTimeout, def.ReadHeaderTimeout, DefaultReadHeaderTimeout),
		ReadTimeout:       pickD(l.ReadTimeout, def.ReadTimeout, DefaultReadTimeout),
		WriteTimeout:      pickD(l.WriteTimeout, def.WriteTimeout, DefaultWriteTimeout),
		IdleTimeout:       pickD(l.IdleTimeout, def.IdleTimeout, DefaultIdleTimeout),
		MaxHeaderBytes:    pickI(l.MaxHeaderBytes, def.MaxHeaderBytes, DefaultMaxHeaderBytes),
		MaxConns:          pickI(l.MaxConns, def.MaxConns, DefaultMaxConns),
	}
}

// Stats are a server's connection counters since it started serving.
type Stats struct {
	// Open is the number of connections held now; MaxConns the cap in force
	// (after the open-file limit).
	Open, MaxConns int
	// Accepted counts connections admitted; Evicted the idle or still-reading
	// connections closed to admit a new one at the cap; Refused the new
	// connections closed at once because every held one was being served.
	Accepted, Evicted, Refused uint64
}

// warnEvery spaces the warnings a server logs while it is at its cap.
const warnEvery = 10 * time.Second

// Server is an HTTP server with [Limits]. Build it with [New], run it with
// [Server.Serve], stop it with [Server.Shutdown] or [Server.Close]. Safe for
// concurrent use.
type Server struct {
	srv    *http.Server
	limits Limits
	logger *slog.Logger
	name   string

	mu       sync.Mutex
	reading  list.List // *conn still sending a request, oldest first
	idle     list.List // *conn idle between requests, oldest first
	open     int
	lastWarn time.Time

	accepted, evicted, refused atomic.Uint64
}

// New returns a server of h with limits l (zero fields: the package
// defaults; a component passes l.WithDefaults(its own) first). name labels
// its log lines (e.g. "api", "metrics"); logger receives net/http's errors at
// Warn and the cap warnings (nil: slog.Default()).
func New(name string, h http.Handler, l Limits, logger *slog.Logger) *Server {
	if logger == nil {
		logger = slog.Default()
	}
	l = l.WithDefaults(Limits{})
	if lim := fdLimit(); lim > 0 && uint64(l.MaxConns) > lim/2 {
		logger.Warn("http connection cap lowered to half the open-file limit", "server", name, "max_conns", l.MaxConns, "rlimit_nofile", lim)
		l.MaxConns = max(1, int(lim/2))
	}
	s := &Server{limits: l, logger: logger, name: name}
	s.srv = &http.Server{
		Handler:           s.track(h),
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		ReadTimeout:       l.ReadTimeout,
		WriteTimeout:      l.WriteTimeout,
		IdleTimeout:       l.IdleTimeout,
		MaxHeaderBytes:    l.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(logger.With("server", name).Handler(), slog.LevelWarn),
		ConnState:         s.connState,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if tc := asConn(c); tc != nil {
				return context.WithValue(ctx, connKey{}, tc)
			}
			return ctx
		},
	}
	return s
}

// Limits returns the limits in force (defaults applied, MaxConns after the
// open-file limit).
func (s *Server) Limits() Limits { return s.limits }

// Serve accepts connections on ln, at most MaxConns held at once, and serves
// them until Shutdown or Close; it then returns http.ErrServerClosed. ln is
// closed when Serve returns.
func (s *Server) Serve(ln net.Listener) error {
	return s.srv.Serve(&listener{Listener: ln, s: s})
}

// Shutdown stops the server gracefully (http.Server.Shutdown): it closes the
// listener and the idle connections, then waits for the active ones until
// ctx ends.
func (s *Server) Shutdown(ctx context.Context) error { return s.srv.Shutdown(ctx) }

// Close closes the listener and every connection at once.
func (s *Server) Close() error { return s.srv.Close() }

// Stats returns the connection counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	open := s.open
	s.mu.Unlock()
	return Stats{Open: open, MaxConns: s.limits.MaxConns,
		Accepted: s.accepted.Load(), Evicted: s.evicted.Load(), Refused: s.refused.Load()}
}

// connKey is the context key of a request's *conn.
type connKey struct{}

// phases of a connection.
const (
	phaseReading = iota // sending a request (headers or body): evictable
	phaseServing        // past its request body: never evicted
	phaseIdle           // between requests: evictable first
	phaseClosed
)

// conn is a held connection and its place in the server's eviction lists.
type conn struct {
	net.Conn
	s *Server

	// Guarded by s.mu.
	phase   int
	elem    *list.Element // in s.reading or s.idle, nil otherwise
	serving int           // requests past their body (more than one with HTTP/2)
}

// asConn returns the *conn under c (a TLS connection wraps it), or nil.
func asConn(c net.Conn) *conn {
	for c != nil {
		if tc, ok := c.(*conn); ok {
			return tc
		}
		u, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			return nil
		}
		c = u.NetConn()
	}
	return nil
}

// setPhaseLocked moves c to phase p, in the matching list. s.mu is held.
func (c *conn) setPhaseLocked(p int) {
	s := c.s
	if c.phase == phaseClosed || (c.phase == p && p == phaseServing) {
		return
	}
	if c.elem != nil {
		if c.phase == phaseIdle {
			s.idle.Remove(c.elem)
		} else {
			s.reading.Remove(c.elem)
		}
		c.elem = nil
	}
	c.phase = p
	switch p {
	case phaseReading:
		c.elem = s.reading.PushBack(c)
	case phaseIdle:
		c.elem = s.idle.PushBack(c)
	case phaseClosed:
		s.open--
	}
}

// Close closes the connection and gives its slot back (once).
func (c *conn) Close() error {
	c.s.mu.Lock()
	c.setPhaseLocked(phaseClosed)
	c.s.mu.Unlock()
	return c.Conn.Close()
}

// connState follows net/http's view of each connection: a keep-alive
// connection that starts a new request is reading again; one that finished
// its response is idle.
func (s *Server) connState(nc net.Conn, st http.ConnState) {
	c := asConn(nc)
	if c == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch st {
	case http.StateActive:
		if c.phase == phaseIdle {
			c.setPhaseLocked(phaseReading)
		}
	case http.StateIdle:
		if c.serving == 0 {
			c.setPhaseLocked(phaseIdle)
		}
	case http.StateHijacked, http.StateClosed:
		c.setPhaseLocked(phaseClosed)
	}
}

// track marks a request's connection as being served once the request body
// has been read to its end (at once when there is none), and no longer when
// the handler returns.
func (s *Server) track(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _ := r.Context().Value(connKey{}).(*conn)
		if c == nil {
			h.ServeHTTP(w, r)
			return
		}
		var once sync.Once
		begin := func() {
			once.Do(func() {
				s.mu.Lock()
				c.serving++
				c.setPhaseLocked(phaseServing)
				s.mu.Unlock()
			})
		}
		if r.Body == nil || r.Body == http.NoBody {
			begin()
		} else {
			r.Body = &eofBody{ReadCloser: r.Body, onEOF: begin}
		}
		defer func() {
			began := true
			once.Do(func() { began = false })
			if began {
				s.mu.Lock()
				c.serving--
				s.mu.Unlock()
			}
		}()
		h.ServeHTTP(w, r)
	})
}

// eofBody calls onEOF when the body has been read to its end.
type eofBody struct {
	io.ReadCloser
	onEOF func()
}

func (b *eofBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if errors.Is(err, io.EOF) {
		b.onEOF()
	}
	return n, err
}

// listener admits connections under the server's cap.
type listener struct {
	net.Listener
	s *Server
}

// Accept returns the next connection. At the cap it closes the oldest idle,
// else the oldest still-reading connection to make room; when every held
// connection is being served it refuses the new one (a reset) and waits for
// the next.
func (l *listener) Accept() (net.Conn, error) {
	s := l.s
	for {
		nc, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		s.mu.Lock()
		var victim *conn
		if s.open >= s.limits.MaxConns {
			if e := s.idle.Front(); e != nil {
				victim = e.Value.(*conn)
			} else if e := s.reading.Front(); e != nil {
				victim = e.Value.(*conn)
			}
			if victim == nil {
				s.mu.Unlock()
				s.refused.Add(1)
				abort(nc)
				s.warnAtCap()
				continue
			}
			victim.setPhaseLocked(phaseClosed)
		}
		c := &conn{Conn: nc, s: s}
		s.open++
		c.setPhaseLocked(phaseReading)
		s.mu.Unlock()
		if victim != nil {
			s.evicted.Add(1)
			abort(victim.Conn)
			s.warnAtCap()
		}
		s.accepted.Add(1)
		return c, nil
	}
}

// abort closes c with a reset (no lingering, no TIME_WAIT on our side).
func abort(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// warnAtCap logs, at most every warnEvery, that the server is at its cap.
func (s *Server) warnAtCap() {
	s.mu.Lock()
	now := time.Now()
	if now.Sub(s.lastWarn) < warnEvery {
		s.mu.Unlock()
		return
	}
	s.lastWarn = now
	open := s.open
	s.mu.Unlock()
	s.logger.Warn("http connection cap reached: evicting idle or slow connections, refusing when all are busy",
		"server", s.name, "open", open, "max_conns", s.limits.MaxConns,
		"evicted_total", s.evicted.Load(), "refused_total", s.refused.Load())
}
