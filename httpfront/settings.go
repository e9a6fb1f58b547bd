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
	// Limits are the HTTP server's (httpserve.Limits; a zero field takes httpserve's default,
	// MaxConns DefaultMaxConns). The write deadline is renewed before every write of a
	// response (see [StatusWriter]), so a long generation or stream is never cut.
	httpserve.Limits
}

// WithDefaults returns s with every zero (or negative) field set to its default.
func (s Settings) WithDefaults() Settings {
	if s.MaxBodyBytes <= 0 {
		s.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if s.RequestTimeout <= 0 {
		s.RequestTimeout = DefaultRequestTimeout
	}
	s.Limits = s.Limits.WithDefaults(httpserve.Limits{MaxConns: DefaultMaxConns})
	return s
}
