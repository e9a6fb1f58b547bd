package chunkstore

import (
	"container/list"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Defaults of a zero Config.
const (
	DefaultL1Bytes = 1 << 30 // 1 GiB
	DefaultReaders = 4       // parallel L2 readers in GetMany
)

// Errors a caller can decide on.
var (
	// ErrNotFound reports a key held by no tier.
	ErrNotFound = errors.New("chunkstore: chunk not found")
	// ErrTooLarge reports a chunk that no tier admits (larger than the L1
	// budget and, when L2 is configured, than the L2 budget).
	ErrTooLarge = errors.New("chunkstore: chunk larger than the budget")
	// ErrLayoutMismatch reports a chunk whose layout differs from
	// Config.Layout, or that exceeds Config.ChunkSize tokens.
	ErrLayoutMismatch = errors.New("chunkstore: chunk layout mismatch")
	// ErrL2Write marks a chunk whose L2 file could not be written (a full
	// disk, an I/O error): see L2WriteError.
	ErrL2Write = errors.New("chunkstore: chunk file not written")
	// ErrUnsafeDir reports an L2 directory that is a symbolic link, not a
	// directory, or not owned by this process's user.
	ErrUnsafeDir = errors.New("chunkstore: unsafe L2 directory")
)

// L2WriteError is the error of a Put whose chunk file could not be
// written. InL1 reports that the chunk is nevertheless held in memory (it
// is then not durable: a restart loses it; the store writes it again after
// a later write succeeds, see Stats.PendingL2). DiskFull reports ENOSPC or
// EDQUOT. errors.Is(err, ErrL2Write) holds.
type L2WriteError struct {
	Key      Key
	InL1     bool
	DiskFull bool
	Err      error
}

// Error names the chunk and the cause.
func (e *L2WriteError) Error() string {
	return fmt.Sprintf("chunkstore: chunk %s not written to L2: %v", e.Key, e.Err)
}

// Unwrap returns ErrL2Write and the cause.
func (e *L2WriteError) Unwrap() []error { return []error{ErrL2Write, e.Err} }

// IsDiskFull reports whether err is a full disk or an exhausted quota.
func IsDiskFull(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// Tier names where a chunk is held.
type Tier uint8

// Tiers, from fastest to slowest.
const (
	TierNone Tier = iota // not held
	TierL1               // memory
	TierL2               // chunk-file directory
)

// String is "none", "l1" or "l2".
func (t Tier) String() string {
	switch t {
	case TierL1:
		return "l1"
	case TierL2:
		return "l2"
	default:
		return "none"
	}
}

// Config holds the optional settings of a Store; the zero value is a 1 GiB
// L1-only store of 256-token chunks of any layout.
type Config struct {
	// L1Bytes is the hard byte budget of the memory tier (DefaultL1Bytes when
	// <= 0). Accounted bytes (Chunk.Size) never exceed it; a larger chunk is
	// not admitted to L1.
	L1Bytes int64
	// Dir is the L2 directory of chunk files (created with mode 0700 when
	// missing). Empty means no L2. Writes are write-through: Put writes the
	// file before returning.
	Dir string
	// L2Bytes bounds the total size of the chunk files; the oldest-written
	// files are evicted beyond it. Zero or negative means unbounded.
	L2Bytes int64
	// ChunkSize is the maximum tokens per chunk accepted by Put
	// (DefaultChunkSize when <= 0).
	ChunkSize int
	// Layout, when non-zero, is the only layout accepted by Put and from L2
	// files (a file with another layout is a counted corrupt miss).
	Layout Layout
	// Readers bounds the goroutines reading L2 files in one GetMany
	// (DefaultReaders when <= 0).
	Readers int
	// Sync makes Put fsync each chunk file before renaming it into place.
	Sync bool
	// OnEvict, when set, is called after a chunk leaves a tier (eviction,
	// or removal of a corrupt L2 file), without any store lock held, from the
	// goroutine whose call caused it. goneFromAllTiers reports whether the
	// chunk was then held by no tier. It must be safe for concurrent use.
	OnEvict func(key Key, tier Tier, goneFromAllTiers bool)
}

// Stats is a snapshot of a Store's occupancy and counters.
type Stats struct {
	L1Chunks, L2Chunks int
	L1Bytes, L2Bytes   int64 // accounted bytes (L1) and file bytes (L2)
	L1Budget, L2Budget int64 // L2Budget 0 = unbounded

	Puts              int64 // successful Put calls
	L1Hits, L2Hits    int64 // Get/GetMany lookups served by each tier
	Misses            int64 // lookups served by no tier (incl. corrupt)
	L1Evictions       int64 // chunks evicted from L1 by its budget
	L2Evictions       int64 // chunk files evicted by the L2 budget
	L1Rejected        int64 // chunks larger than the L1 budget
	L2Rejected        int64 // chunks larger than the L2 budget
	Corrupt           int64 // L2 files rejected as corrupt (then removed)
	ReadErrors        int64 // L2 reads failing for an I/O reason
	WriteErrors       int64 // L2 writes failing
	L2ReadBytes       int64 // bytes read from chunk files
	L2WrittenBytes    int64 // bytes written to chunk files
	StaleTempsRemoved int64 // leftover temp files removed by New
	// Quarantined counts L2 files that did not decode, renamed aside to
	// <name>.corrupt (never deleted: the store only deletes files it can
	// tell it wrote).
	Quarantined int64
	// PendingL2 is the number of chunks held in L1 only because their L2
	// write failed (not durable: a restart loses them); the store writes
	// them again, a few after each successful L2 write. LostPendingL2
	// counts those evicted from L1 before that happened.
	PendingL2     int
	LostPendingL2 int64
	// DiskFull is true from an L2 write that failed with ENOSPC or EDQUOT
	// until the next successful one; LastWriteError is the last failed L2
	// write's error ("" when none failed since the last success).
	DiskFull       bool
	LastWriteError string
}

// LoadStats describes one GetMany call (the sparse prefetch and its coalesced
// L2 load).
type LoadStats struct {
	Keys     int           // distinct keys asked for
	L1Hits   int           // served from memory
	L2Misses int           // not in L1, read from L2 in the coalesced batch
	Chunks   int           // chunks successfully loaded from L2
	Bytes    int64         // file bytes read for them
	Start    time.Time     // when the L2 batch began (zero when empty)
	Duration time.Duration // wall time of the L2 batch, from Start (0 when empty)
	Corrupt  int           // L2 files rejected as corrupt
	Errors   int           // L2 reads failing for an I/O reason
	Missing  int           // keys held by no tier (including vanished files)
}

type l1Entry struct {
	key   Key
	chunk *Chunk
	size  int64
	elem  *list.Element
}

type l2Entry struct {
	key  Key
	size int64
	elem *list.Element
}

type evictEvent struct {
	key  Key
	tier Tier
}

// Store is a two-tier chunk store: L1 memory under a hard LRU byte budget
// and an optional L2 directory of checksummed chunk files. All methods are
// safe for concurrent use. Chunks put in or returned by the store are shared
// and must not be modified.
type Store struct {
	cfg Config

	mu      sync.Mutex // guards the L1 fields
	l1      map[Key]*l1Entry
	l1lru   list.List // front = most recently used
	l1bytes int64

	l2mu    sync.Mutex // guards the L2 fields and renames/removals in Dir
	l2      map[Key]*l2Entry
	l2order list.List // front = oldest written
	l2bytes int64

	pmu     sync.Mutex       // guards pending
	pending map[Key]struct{} // in L1, L2 write failed (see Stats.PendingL2)

	wmu      sync.Mutex // guards lastWErr
	lastWErr string
	diskFull atomic.Bool

	storeCounters
}

// storeCounters are a Store's running totals (see Stats).
type storeCounters struct {
	puts, l1hits, l2hits, misses       atomic.Int64
	l1evict, l2evict, l1rej, l2rej     atomic.Int64
	corrupt, readErrs, writeErrs       atomic.Int64
	l2readBytes, l2written, staleTemps atomic.Int64
	quarantined, lostPending           atomic.Int64
}

// maxRepairPerPut bounds the pending chunks one successful L2 write
// writes again (so a Put after a full disk freed up stays short).
const maxRepairPerPut = 4

const (
	fileExt       = ".chunk"
	tempPrefix    = ".tmp-"
	quarantineExt = ".corrupt"
)

// New returns a store for cfg. With a Dir it creates the directory, removes
// leftover temp files of interrupted writes, indexes the existing chunk files
// (oldest first, by modification time) and applies the L2 budget.
func New(cfg Config) (*Store, error) {
	if cfg.L1Bytes <= 0 {
		cfg.L1Bytes = DefaultL1Bytes
	}
	if cfg.ChunkSize <= 0 {
		cfg.ChunkSize = DefaultChunkSize
	}
	if cfg.ChunkSize > MaxChunkTokens {
		return nil, fmt.Errorf("chunkstore: chunk size %d exceeds %d", cfg.ChunkSize, MaxChunkTokens)
	}
	if cfg.Readers <= 0 {
		cfg.Readers = DefaultReaders
	}
	if cfg.L2Bytes < 0 {
		cfg.L2Bytes = 0
	}
	if cfg.Layout != (Layout{}) {
		if err := cfg.Layout.Validate(); err != nil {
			return nil, fmt.Errorf("chunkstore: config layout: %w", err)
		}
	}
	s := &Store{cfg: cfg, l1: make(map[Key]*l1Entry), l2: make(map[Key]*l2Entry), pending: make(map[Key]struct{})}
	if cfg.Dir != "" {
		if err := s.scanDir(); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func (s *Store) scanDir() error {
	if err := MakeDir(s.cfg.Dir); err != nil {
		return err
	}
	entries, err := os.ReadDir(s.cfg.Dir)
	if err != nil {
		return fmt.Errorf("chunkstore: scan L2 directory: %w", err)
	}
	type found struct {
		key  Key
		size int64
		mod  time.Time
	}
	var files []found
	for _, e := range entries {
		name := e.Name()
		if isTempName(name) && e.Type().IsRegular() {
			if os.Remove(filepath.Join(s.cfg.Dir, name)) == nil {
				s.staleTemps.Add(1)
			}
			continue
		}
		if !e.Type().IsRegular() || !strings.HasSuffix(name, fileExt) {
			continue
		}
		k, err := ParseKey(strings.TrimSuffix(name, fileExt))
		if err != nil {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		files = append(files, found{k, info.Size(), info.ModTime()})
	}
	sort.SliceStable(files, func(i, j int) bool { return files[i].mod.Before(files[j].mod) })
	s.l2mu.Lock()
	for _, f := range files {
		s.l2add(f.key, f.size)
	}
	evicted := s.l2enforce(Key{}, false)
	s.l2mu.Unlock()
	s.notify(evicted)
	return nil
}

// isTempName reports whether name is a temp file this store creates
// (.tmp-<key>-<random digits>): the only names New removes unread.
func isTempName(name string) bool {
	rest, ok := strings.CutPrefix(name, tempPrefix)
	if !ok {
		return false
	}
	k, suffix, ok := strings.Cut(rest, "-")
	if _, err := ParseKey(k); err != nil || !ok || suffix == "" {
		return false
	}
	return strings.Trim(suffix, "0123456789") == ""
}

// MakeDir creates dir (mode 0700) when missing, without following a
// symbolic link at dir itself, and checks it: a directory (not a link)
// owned by this process's user (ErrUnsafeDir otherwise). The L2 directory
// and the blend server's sequences directory are made with it.
func MakeDir(dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("chunkstore: create L2 directory: %w", err)
		}
		// A missing parent: created the usual way, then dir itself.
		if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
			return fmt.Errorf("chunkstore: create L2 directory: %w", err)
		}
		if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("chunkstore: create L2 directory: %w", err)
		}
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("chunkstore: L2 directory: %w", err)
	}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		return fmt.Errorf("%w: %s is a symbolic link (not followed)", ErrUnsafeDir, dir)
	case !fi.IsDir():
		return fmt.Errorf("%w: %s is not a directory", ErrUnsafeDir, dir)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Getuid() {
		return fmt.Errorf("%w: %s belongs to uid %d, not %d", ErrUnsafeDir, dir, st.Uid, os.Getuid())
	}
	return nil
}

func (s *Store) path(k Key) string { return filepath.Join(s.cfg.Dir, k.String()+fileExt) }

// Put stores c: into L1 (unless larger than the L1 budget) and, when L2 is
// configured, write-through into a chunk file written to a temp file and
// renamed into place. A chunk replaces any chunk with the same key. It
// returns ErrBadChunk or ErrLayoutMismatch for a chunk that does not fit the
// store, ErrTooLarge when no tier admits it, and a wrapped I/O error when the
// L2 write fails (the chunk then stays in L1 if admitted there).
func (s *Store) Put(c *Chunk) error {
	if err := c.Validate(); err != nil {
		return err
	}
	if c.Len() > s.cfg.ChunkSize {
		return fmt.Errorf("%w: %d tokens exceeds the chunk size %d", ErrLayoutMismatch, c.Len(), s.cfg.ChunkSize)
	}
	if s.cfg.Layout != (Layout{}) && c.Layout != s.cfg.Layout {
		return fmt.Errorf("%w: chunk %+v, store %+v", ErrLayoutMismatch, c.Layout, s.cfg.Layout)
	}
	inL1 := s.admit([]*Chunk{c}) == 1
	if s.cfg.Dir == "" {
		if !inL1 {
			return fmt.Errorf("%w: %d bytes, L1 budget %d", ErrTooLarge, c.Size(), s.cfg.L1Bytes)
		}
		s.puts.Add(1)
		return nil
	}
	if err := s.writeL2(c); err != nil {
		if errors.Is(err, ErrTooLarge) && inL1 {
			s.puts.Add(1)
			return nil
		}
		if errors.Is(err, ErrTooLarge) {
			return err
		}
		// Still in L1 (unless evicted meanwhile): pending, written again
		// after a later write succeeds.
		if inL1 && s.Contains(c.Key) == TierL1 {
			s.pmu.Lock()
			s.pending[c.Key] = struct{}{}
			s.pmu.Unlock()
		} else {
			inL1 = false
		}
		return &L2WriteError{Key: c.Key, InL1: inL1, DiskFull: IsDiskFull(err), Err: err}
	}
	s.puts.Add(1)
	s.repairPending()
	return nil
}

// repairPending writes again, after a successful L2 write, up to
// maxRepairPerPut chunks whose earlier L2 write failed and that L1 still
// holds; it stops at the first failure.
func (s *Store) repairPending() {
	s.pmu.Lock()
	if len(s.pending) == 0 {
		s.pmu.Unlock()
		return
	}
	keys := make([]Key, 0, maxRepairPerPut)
	for k := range s.pending {
		if len(keys) == maxRepairPerPut {
			break
		}
		keys = append(keys, k)
		delete(s.pending, k)
	}
	s.pmu.Unlock()
	for i, k := range keys {
		c := s.l1peek(k)
		if c == nil || s.inL2(k) {
			continue // evicted (counted then) or written meanwhile
		}
		if err := s.writeL2(c); err != nil {
			s.pmu.Lock()
			for _, k := range keys[i:] {
				s.pending[k] = struct{}{}
			}
			s.pmu.Unlock()
			return
		}
	}
}

// l1peek returns key's chunk in L1 without touching the LRU order.
func (s *Store) l1peek(key Key) *Chunk {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.l1[key]; ok {
		return e.chunk
	}
	return nil
}

// Durable reports whether key's chunk is in a tier that survives a
// restart: its L2 file is indexed (with an L2), or, without an L2, whether
// L1 holds it (there is nothing more durable to claim).
func (s *Store) Durable(key Key) bool {
	if s.cfg.Dir == "" {
		return s.Contains(key) == TierL1
	}
	return s.inL2(key)
}

// writeFailed records a failed L2 write (disk-full state, last error).
func (s *Store) writeFailed(err error) {
	s.writeErrs.Add(1)
	s.diskFull.Store(IsDiskFull(err))
	s.wmu.Lock()
	s.lastWErr = err.Error()
	s.wmu.Unlock()
}

// admit inserts chunks into L1 (most recent last), evicting LRU entries to
// stay within the budget, and returns how many were admitted.
func (s *Store) admit(chunks []*Chunk) int {
	var evicted []evictEvent
	n := 0
	s.mu.Lock()
	for _, c := range chunks {
		size := c.Size()
		if size > s.cfg.L1Bytes {
			s.l1rej.Add(1)
			continue
		}
		if e, ok := s.l1[c.Key]; ok {
			s.l1bytes -= e.size
			e.chunk, e.size = c, size
			s.l1bytes += size
			s.l1lru.MoveToFront(e.elem)
		} else {
			e := &l1Entry{key: c.Key, chunk: c, size: size}
			e.elem = s.l1lru.PushFront(e)
			s.l1[c.Key] = e
			s.l1bytes += size
		}
		n++
		for s.l1bytes > s.cfg.L1Bytes {
			old := s.l1lru.Back().Value.(*l1Entry)
			s.l1lru.Remove(old.elem)
			delete(s.l1, old.key)
			s.l1bytes -= old.size
			s.l1evict.Add(1)
			evicted = append(evicted, evictEvent{old.key, TierL1})
		}
	}
	s.mu.Unlock()
	if len(evicted) > 0 {
		s.pmu.Lock()
		for _, ev := range evicted {
			if _, ok := s.pending[ev.key]; ok {
				delete(s.pending, ev.key)
				s.lostPending.Add(1)
			}
		}
		s.pmu.Unlock()
	}
	s.notify(evicted)
	return n
}

// writeL2 writes c's file atomically and accounts it, evicting the oldest
// files beyond the L2 budget.
func (s *Store) writeL2(c *Chunk) error {
	size := EncodedSize(c)
	if s.cfg.L2Bytes > 0 && size > s.cfg.L2Bytes {
		s.l2rej.Add(1)
		return fmt.Errorf("%w: %d bytes, L2 budget %d", ErrTooLarge, size, s.cfg.L2Bytes)
	}
	f, err := os.CreateTemp(s.cfg.Dir, tempPrefix+c.Key.String()+"-*")
	if err != nil {
		err = fmt.Errorf("chunkstore: create chunk file: %w", err)
		s.writeFailed(err)
		return err
	}
	tmp := f.Name()
	fail := func(err error) error {
		f.Close()
		os.Remove(tmp)
		s.writeFailed(err)
		return err
	}
	written, err := writeChunk(f, c)
	if err != nil {
		return fail(err)
	}
	if s.cfg.Sync {
		if err := f.Sync(); err != nil {
			return fail(fmt.Errorf("chunkstore: sync chunk file: %w", err))
		}
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		err = fmt.Errorf("chunkstore: close chunk file: %w", err)
		s.writeFailed(err)
		return err
	}
	s.l2mu.Lock()
	if err := os.Rename(tmp, s.path(c.Key)); err != nil {
		s.l2mu.Unlock()
		os.Remove(tmp)
		err = fmt.Errorf("chunkstore: rename chunk file: %w", err)
		s.writeFailed(err)
		return err
	}
	s.l2add(c.Key, written)
	evicted := s.l2enforce(c.Key, true)
	s.l2mu.Unlock()
	s.l2written.Add(written)
	s.diskFull.Store(false)
	s.wmu.Lock()
	s.lastWErr = ""
	s.wmu.Unlock()
	s.pmu.Lock()
	delete(s.pending, c.Key)
	s.pmu.Unlock()
	s.notify(evicted)
	return nil
}

func (s *Store) lastWriteError() string {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return s.lastWErr
}

// l2add records (or re-records as newest) a file. Caller holds l2mu.
func (s *Store) l2add(k Key, size int64) {
	if e, ok := s.l2[k]; ok {
		s.l2bytes += size - e.size
		e.size = size
		s.l2order.MoveToBack(e.elem)
		return
	}
	e := &l2Entry{key: k, size: size}
	e.elem = s.l2order.PushBack(e)
	s.l2[k] = e
	s.l2bytes += size
}

// l2drop forgets a file and removes it. Caller holds l2mu.
func (s *Store) l2drop(e *l2Entry) {
	s.l2forget(e)
	os.Remove(s.path(e.key))
}

// l2forget forgets a file, leaving it on disk. Caller holds l2mu.
func (s *Store) l2forget(e *l2Entry) {
	s.l2order.Remove(e.elem)
	delete(s.l2, e.key)
	s.l2bytes -= e.size
}

// l2enforce evicts the oldest files (never keep, when skip) until the L2
// budget holds. Caller holds l2mu.
func (s *Store) l2enforce(keep Key, skip bool) []evictEvent {
	if s.cfg.L2Bytes <= 0 {
		return nil
	}
	var evicted []evictEvent
	for el := s.l2order.Front(); el != nil && s.l2bytes > s.cfg.L2Bytes; {
		e := el.Value.(*l2Entry)
		el = el.Next()
		if skip && e.key == keep {
			continue
		}
		s.l2drop(e)
		s.l2evict.Add(1)
		evicted = append(evicted, evictEvent{e.key, TierL2})
	}
	return evicted
}

// notify calls OnEvict for each event; no lock may be held.
func (s *Store) notify(events []evictEvent) {
	if s.cfg.OnEvict == nil {
		return
	}
	for _, ev := range events {
		s.cfg.OnEvict(ev.key, ev.tier, s.Contains(ev.key) == TierNone)
	}
}

// Contains reports the fastest tier holding key (TierL1, TierL2) or TierNone.
// It does not touch the LRU order or read files.
func (s *Store) Contains(key Key) Tier {
	s.mu.Lock()
	_, ok := s.l1[key]
	s.mu.Unlock()
	if ok {
		return TierL1
	}
	s.l2mu.Lock()
	_, ok = s.l2[key]
	s.l2mu.Unlock()
	if ok {
		return TierL2
	}
	return TierNone
}

// Present is Contains that does not trust the L2 index alone: a chunk
// indexed in L2 whose file is gone (removed by hand, a wiped disk) is
// forgotten and reported absent. It costs one stat per L2 chunk.
func (s *Store) Present(key Key) bool {
	switch s.Contains(key) {
	case TierL1:
		return true
	case TierL2:
		if _, err := os.Stat(s.path(key)); errors.Is(err, fs.ErrNotExist) {
			s.forgetL2(key, false)
			return false
		}
		return true
	}
	return false
}

// PrefixChunks is CountPrefix against this store: the number of leading keys
// held by some tier.
func (s *Store) PrefixChunks(keys []Key) int {
	return CountPrefix(keys, func(k Key) bool { return s.Contains(k) != TierNone })
}

func (s *Store) l1get(key Key) *Chunk {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.l1[key]; ok {
		s.l1lru.MoveToFront(e.elem)
		return e.chunk
	}
	return nil
}

func (s *Store) inL2(key Key) bool {
	s.l2mu.Lock()
	defer s.l2mu.Unlock()
	_, ok := s.l2[key]
	return ok
}

// Get returns the chunk for key and the tier that served it: L1, else the L2
// file (then promoted to L1). A missing key returns ErrNotFound; a corrupt
// file (bad magic, version, checksum, truncation, wrong key or layout) is
// forgotten and renamed aside (<name>.corrupt, Stats.Quarantined), counted
// and returns an error wrapping ErrCorrupt; the chunk is
// then nil and the tier TierNone.
func (s *Store) Get(key Key) (*Chunk, Tier, error) {
	if c := s.l1get(key); c != nil {
		s.l1hits.Add(1)
		return c, TierL1, nil
	}
	if s.cfg.Dir == "" || !s.inL2(key) {
		s.misses.Add(1)
		return nil, TierNone, fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	c, _, err := s.loadL2(key)
	if err != nil {
		s.misses.Add(1)
		return nil, TierNone, err
	}
	s.l2hits.Add(1)
	s.admit([]*Chunk{c})
	return c, TierL2, nil
}

// loadL2 reads and checks one chunk file, handling a vanished or corrupt
// file; it returns the file size read.
func (s *Store) loadL2(key Key) (*Chunk, int64, error) {
	c, size, err := readChunkFile(s.path(key))
	if err == nil {
		switch {
		case c.Key != key:
			err = fmt.Errorf("%w: file holds key %s", ErrCorrupt, c.Key)
		case s.cfg.Layout != (Layout{}) && c.Layout != s.cfg.Layout:
			err = fmt.Errorf("%w: layout %+v, store %+v", ErrCorrupt, c.Layout, s.cfg.Layout)
		}
	}
	switch {
	case err == nil:
		s.l2readBytes.Add(size)
		return c, size, nil
	case errors.Is(err, fs.ErrNotExist):
		s.forgetL2(key, false)
		return nil, 0, fmt.Errorf("%w: %s (file vanished)", ErrNotFound, key)
	case errors.Is(err, ErrCorrupt):
		s.corrupt.Add(1)
		s.forgetL2(key, true)
		return nil, size, fmt.Errorf("chunkstore: chunk %s: %w", key, err)
	default:
		s.readErrs.Add(1)
		return nil, 0, fmt.Errorf("chunkstore: read chunk %s: %w", key, err)
	}
}

// forgetL2 drops key from the L2 index and notifies OnEvict; with
// quarantine its file, which did not decode, is renamed aside to
// <name>.corrupt (never deleted: it may not be this store's; a later scan
// ignores it).
func (s *Store) forgetL2(key Key, quarantine bool) {
	s.l2mu.Lock()
	e, ok := s.l2[key]
	if ok {
		s.l2forget(e)
		if quarantine && os.Rename(s.path(key), s.path(key)+quarantineExt) == nil {
			s.quarantined.Add(1)
		}
	}
	s.l2mu.Unlock()
	if ok {
		s.notify([]evictEvent{{key, TierL2}})
	}
}

// GetMany is the sparse prefetch: it returns every chunk found for keys.
// L1 hits are served directly; the L1 misses held by L2 are read in one
// coalesced batch by up to Config.Readers goroutines in parallel, promoted
// to L1 together, and described by the returned LoadStats. Keys held by no
// tier, vanished or corrupt files are absent from the map (and counted).
func (s *Store) GetMany(keys []Key) (map[Key]*Chunk, LoadStats) {
	out := make(map[Key]*Chunk, len(keys))
	var st LoadStats
	var toLoad []Key
	seen := make(map[Key]struct{}, len(keys))
	s.mu.Lock()
	for _, k := range keys {
		if _, dup := seen[k]; dup {
			continue
		}
		seen[k] = struct{}{}
		if e, ok := s.l1[k]; ok {
			s.l1lru.MoveToFront(e.elem)
			out[k] = e.chunk
			continue
		}
		toLoad = append(toLoad, k)
	}
	s.mu.Unlock()
	st.Keys = len(seen)
	st.L1Hits = len(out)
	s.l1hits.Add(int64(st.L1Hits))

	if s.cfg.Dir != "" && len(toLoad) > 0 {
		s.l2mu.Lock()
		inL2 := toLoad[:0]
		for _, k := range toLoad {
			if _, ok := s.l2[k]; ok {
				inL2 = append(inL2, k)
			} else {
				st.Missing++
			}
		}
		s.l2mu.Unlock()
		toLoad = inL2
	} else {
		st.Missing += len(toLoad)
		toLoad = nil
	}
	st.L2Misses = len(toLoad)
	if len(toLoad) > 0 {
		start := time.Now()
		type result struct {
			c    *Chunk
			size int64
			err  error
		}
		results := make([]result, len(toLoad))
		var next atomic.Int64
		var wg sync.WaitGroup
		for range min(len(toLoad), s.cfg.Readers) {
			wg.Go(func() {
				for {
					i := int(next.Add(1)) - 1
					if i >= len(toLoad) {
						return
					}
					c, size, err := s.loadL2(toLoad[i])
					results[i] = result{c, size, err}
				}
			})
		}
		wg.Wait()
		st.Start, st.Duration = start, time.Since(start)
		loaded := make([]*Chunk, 0, len(toLoad))
		for i, r := range results {
			switch {
			case r.err == nil:
				out[toLoad[i]] = r.c
				loaded = append(loaded, r.c)
				st.Chunks++
				st.Bytes += r.size
			case errors.Is(r.err, ErrCorrupt):
				st.Corrupt++
			case errors.Is(r.err, ErrNotFound):
				st.Missing++
			default:
				st.Errors++
			}
		}
		s.l2hits.Add(int64(st.Chunks))
		s.admit(loaded)
	}
	s.misses.Add(int64(st.Keys - len(out)))
	return out, st
}

// Stats returns a snapshot of occupancy and counters.
func (s *Store) Stats() Stats {
	var st Stats
	s.mu.Lock()
	st.L1Chunks, st.L1Bytes = len(s.l1), s.l1bytes
	s.mu.Unlock()
	s.l2mu.Lock()
	st.L2Chunks, st.L2Bytes = len(s.l2), s.l2bytes
	s.l2mu.Unlock()
	st.L1Budget, st.L2Budget = s.cfg.L1Bytes, s.cfg.L2Bytes
	st.Puts = s.puts.Load()
	st.L1Hits, st.L2Hits, st.Misses = s.l1hits.Load(), s.l2hits.Load(), s.misses.Load()
	st.L1Evictions, st.L2Evictions = s.l1evict.Load(), s.l2evict.Load()
	st.L1Rejected, st.L2Rejected = s.l1rej.Load(), s.l2rej.Load()
	st.Corrupt, st.ReadErrors, st.WriteErrors = s.corrupt.Load(), s.readErrs.Load(), s.writeErrs.Load()
	st.L2ReadBytes, st.L2WrittenBytes = s.l2readBytes.Load(), s.l2written.Load()
	st.StaleTempsRemoved = s.staleTemps.Load()
	st.Quarantined, st.LostPendingL2 = s.quarantined.Load(), s.lostPending.Load()
	s.pmu.Lock()
	st.PendingL2 = len(s.pending)
	s.pmu.Unlock()
	st.DiskFull, st.LastWriteError = s.diskFull.Load(), s.lastWriteError()
	return st
}

// Config returns the effective configuration (defaults applied).
func (s *Store) Config() Config { return s.cfg }
