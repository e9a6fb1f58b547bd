package blend

import (
	"fmt"
	"github.com/cacheblend/cacheblend/blend/fleet"
	"time"

	"github.com/cacheblend/cacheblend/blend/chunkstore"
	"github.com/cacheblend/cacheblend/blend/events"
	"github.com/cacheblend/cacheblend/blend/fingerprint"
)

// Defaults of a zero Config.
const (
	DefaultChunkSize     = chunkstore.DefaultChunkSize // 256 tokens
	DefaultL1Bytes       = chunkstore.DefaultL1Bytes   // 1 GiB
	DefaultLookupWorkers = 2
	DefaultLookupQueue   = 256
	DefaultCopyWorkers   = 2
	DefaultEventQueue    = events.DefaultQueueSize // 4096
	DefaultRegisterQueue = 1024
	DefaultAddr          = "127.0.0.1:0"
	// DefaultMaxKVRegistrations bounds the KV socket's connections
	// (registered or handshaking) in total: one per worker rank, so 64
	// leaves room for a large host and bounds the server's mappings.
	DefaultMaxKVRegistrations = 64
	// DefaultMaxKVRegistrationsPerPeer bounds them per peer process: a
	// worker (one rank) holds one; the slack covers a connection whose
	// close the server has not handled yet.
	DefaultMaxKVRegistrationsPerPeer = 4
	// DefaultKVHandshakeTimeout bounds the wait for a connection's
	// registration message.
	DefaultKVHandshakeTimeout = 5 * time.Second
)

// DefaultLookupStuckAfter is the default of Config.LookupStuckAfter: 10× the
// engine's default lookup timeout (2 s). A lookup running that long has long
// been given up by its caller, so its worker is stuck (e.g. blocked opening
// an L2 file that never answers).
const DefaultLookupStuckAfter = 20 * time.Second

// Limits on what a request may ask for.
const (
	// MaxTokens bounds the tokens of one lookup or store.
	MaxTokens = 1 << 20
	// MaxWorldSize bounds a lookup's world_size (and a rank).
	MaxWorldSize = 1 << 10
	// MaxMatches bounds the matches of one retrieve.
	MaxMatches = 4096
	// MaxWorkerIDLen bounds a worker id, in bytes.
	MaxWorkerIDLen = 256
)

// Config holds the optional settings of a Server; the zero value is a 1 GiB
// L1-only store of 256-token chunks, two lookup workers, two copy workers
// and a 4096-event bus, served on a free loopback port. A Config is a plain
// value, read once by New.
type Config struct {
	// Fleet is the Redis fleet tier shared by many nodes (package fleet);
	// off when Fleet.URL is empty.
	Fleet fleet.Config
	// Addr is the gRPC listen address (DefaultAddr, a free loopback port,
	// when empty; see Server.Addr).
	Addr string
	// ChunkSize is the number of tokens per stored chunk (DefaultChunkSize
	// when <= 0, at most chunkstore.MaxChunkTokens).
	ChunkSize int
	// L1Bytes is the byte budget of the memory tier (DefaultL1Bytes when <= 0).
	L1Bytes int64
	// L2Dir is the directory of chunk files; "" means no L2.
	L2Dir string
	// L2Bytes bounds the chunk files' total size; <= 0 is unbounded.
	L2Bytes int64
	// FingerprintWindow is the fingerprint window W in tokens
	// (fingerprint.DefaultWindow, 16, when <= 0).
	FingerprintWindow int
	// LookupWorkers is the number of goroutines running lookups
	// (DefaultLookupWorkers when <= 0).
	LookupWorkers int
	// LookupQueue bounds the lookups waiting for a worker; a Lookup beyond
	// it is answered ResourceExhausted (DefaultLookupQueue when <= 0).
	LookupQueue int
	// CopyWorkers is the number of scatter goroutines, the copy "stream"
	// (DefaultCopyWorkers when <= 0).
	CopyWorkers int
	// EventQueue bounds the event bus; events beyond it are dropped and
	// counted (DefaultEventQueue when <= 0).
	EventQueue int
	// RegisterQueue bounds the fingerprint registrations waiting for the
	// registration goroutine; beyond it a registration is dropped and counted
	// (DefaultRegisterQueue when <= 0).
	RegisterQueue int
	// LookupStuckAfter is how long one lookup may run before its worker
	// counts as stuck: the server is then unhealthy (the gRPC health
	// service answers NOT_SERVING, Server.Health returns the reason, the
	// process's /health answers 503) until the lookup returns
	// (DefaultLookupStuckAfter when <= 0).
	LookupStuckAfter time.Duration
	// KVSocket is the path of the Unix socket on which workers hand over
	// their KV memory (package rpc/kvsock): its directory must belong to
	// this user with no access for group or others (its last element is
	// created 0700 when missing). Empty: kv.sock in a new private directory
	// under the OS temp directory, removed at Shutdown (see
	// Server.KVSocket). `cb blend` defaults to kvsock.DefaultPath().
	KVSocket string
	// MaxKVRegistrations bounds the KV socket's connections, registered or
	// handshaking, in total; MaxKVRegistrationsPerPeer per peer process.
	// A connection beyond either is answered RESOURCE_EXHAUSTED and closed
	// (DefaultMaxKVRegistrations, DefaultMaxKVRegistrationsPerPeer when
	// <= 0).
	MaxKVRegistrations, MaxKVRegistrationsPerPeer int
	// KVHandshakeTimeout bounds the wait for a connection's registration
	// (DefaultKVHandshakeTimeout when <= 0).
	KVHandshakeTimeout time.Duration
}

func (c Config) withDefaults() (Config, error) {
	if c.Addr == "" {
		c.Addr = DefaultAddr
	}
	if c.ChunkSize <= 0 {
		c.ChunkSize = DefaultChunkSize
	}
	if c.ChunkSize > chunkstore.MaxChunkTokens {
		return c, fmt.Errorf("blend: chunk size %d exceeds %d", c.ChunkSize, chunkstore.MaxChunkTokens)
	}
	if c.L1Bytes <= 0 {
		c.L1Bytes = DefaultL1Bytes
	}
	if c.L2Bytes < 0 {
		c.L2Bytes = 0
	}
	if c.FingerprintWindow <= 0 {
		c.FingerprintWindow = fingerprint.DefaultWindow
	}
	if c.LookupWorkers <= 0 {
		c.LookupWorkers = DefaultLookupWorkers
	}
	if c.LookupQueue <= 0 {
		c.LookupQueue = DefaultLookupQueue
	}
	if c.CopyWorkers <= 0 {
		c.CopyWorkers = DefaultCopyWorkers
	}
	if c.EventQueue <= 0 {
		c.EventQueue = DefaultEventQueue
	}
	if c.RegisterQueue <= 0 {
		c.RegisterQueue = DefaultRegisterQueue
	}
	if c.MaxKVRegistrations <= 0 {
		c.MaxKVRegistrations = DefaultMaxKVRegistrations
	}
	if c.MaxKVRegistrationsPerPeer <= 0 {
		c.MaxKVRegistrationsPerPeer = DefaultMaxKVRegistrationsPerPeer
	}
	if c.KVHandshakeTimeout <= 0 {
		c.KVHandshakeTimeout = DefaultKVHandshakeTimeout
	}
	if c.LookupStuckAfter <= 0 {
		c.LookupStuckAfter = DefaultLookupStuckAfter
	}
	return c, nil
}
