package httpfront

import (
	"time"

	"github.com/cacheblend/cacheblend/httpserve"
)

// Defaults applied to zero fields of [Settings] (the server limits' are httpserve's: header
// 10 s, read 30 s, write 30 s, idle 60 s, header block 64 KiB).
const (
	DefaultMaxBodyBytes   = 1 << 20
	DefaultRequestTimeout = 10 * time.Minute
	DefaultMaxConns       = 4096
)

// Settings are the settings of the API front that cb-engine and cb-gateway share (embedded in
// engine.Config and gateway.Config, set by the same flags). Every zero field takes its
// documented default ([Settings.WithDefaults]). A plain value.
type Settings struct {
	// APIKey, when set, is required as "Authorization: Bearer <key>" on every /v1/ route (401
	// otherwise). /health and /metrics stay open.
	APIKey string
	// MaxBodyBytes bounds a request body (413 beyond). Default 1 MiB.
	MaxBodyBytes int64
	// RequestTimeout bounds one request from receipt to its end (504 beyond). Default 10 min.
	RequestTimeout time.Duration
	// ReadHeaderTimeout bounds reading a request's headers; a connection that sends none
	// within it is closed. Default 10 s.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a whole request, headers and body, so that a client sending
	// its body slowly holds a connection no longer: the request is answered 408 and the
	// connection closed. It never cuts a response (net/http lifts it once the body is read).
	// Default 30 s.
	ReadTimeout time.Duration
	// WriteTimeout bounds each write of a response: a write (or flush of a streamed event)
	// that a client does not take within it fails and the connection is closed. The deadline
	// is renewed before every write (see [StatusWriter]), so a long generation or stream is
	// never cut. Default 30 s.
	WriteTimeout time.Duration
	// IdleTimeout closes a keep-alive connection that sends no new request within it.
	// Default 60 s.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's header block (431 beyond). Default 64 KiB.
	MaxHeaderBytes int
	// MaxConns caps the connections the API holds at once (lowered to half the process's
	// open-file limit when that is smaller). At the cap a new connection replaces the oldest
	// idle one or the oldest still sending its request; when every held connection is being
	// served, it is refused (see package httpserve). Default 4096 (about 95 MB of memory when
	// every one is held by a slow client).
	MaxConns int
}

// WithDefaults returns s with every zero (or negative) field set to its default.
func (s Settings) WithDefaults() Settings {
	if s.MaxBodyBytes <= 0 {
		s.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if s.RequestTimeout <= 0 {
		s.RequestTimeout = DefaultRequestTimeout
	}
	l := s.serverLimits().WithDefaults(httpserve.Limits{MaxConns: DefaultMaxConns})
	s.ReadHeaderTimeout, s.ReadTimeout, s.WriteTimeout, s.IdleTimeout = l.ReadHeaderTimeout, l.ReadTimeout, l.WriteTimeout, l.IdleTimeout
	s.MaxHeaderBytes, s.MaxConns = l.MaxHeaderBytes, l.MaxConns
	return s
}

// serverLimits returns the HTTP server's limits of s.
func (s Settings) serverLimits() httpserve.Limits {
	return httpserve.Limits{
		ReadHeaderTimeout: s.ReadHeaderTimeout, ReadTimeout: s.ReadTimeout, WriteTimeout: s.WriteTimeout,
		IdleTimeout: s.IdleTimeout, MaxHeaderBytes: s.MaxHeaderBytes, MaxConns: s.MaxConns,
	}
}
