package blend

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cacheblend/cacheblend/blend/chunkstore"
	"github.com/cacheblend/cacheblend/blend/events"
	"github.com/cacheblend/cacheblend/blend/fingerprint"
	"github.com/cacheblend/cacheblend/blend/fleet"
	"github.com/cacheblend/cacheblend/metrics"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
)

// Registered sequences kept in L2 (docs/design.md §3): the fingerprint
// table lives in memory, so without them a restarted blend server would
// hold a document's chunks in L2 but never match the document at another
// position. Each registered rank-0 sequence is written to
// <L2Dir>/sequences/<last chunk key>.seq and registered again at start-up
// when all its chunks are still in L2 (the file, which decoded, is removed
// otherwise; a file that does not decode is renamed aside to .corrupt,
// never deleted). A sequence whose file could not be written (a full disk)
// is kept pending and written with the next sequence written.
const (
	seqDirName = "sequences" // under the L2 directory
	seqExt     = ".seq"
	seqMagic   = "CBS1" // starts a sequence file
	// MaxSequenceFileBytes bounds a sequence file read at start-up.
	MaxSequenceFileBytes = 16 + chunkstore.MaxModelLen + 12 + 4*fleet.MaxSequenceTokens + 32*fleet.MaxSequenceTokens + 8
)

// errBadSequenceFile marks a sequence file that does not decode.
var errBadSequenceFile = errors.New("blend: corrupt sequence file")

var seqCRC = crc32.MakeTable(crc32.Castagnoli)

// encodeSequenceFile is magic, model length, model, the fleet encoding of
// seq, and a CRC32C of all that.
func encodeSequenceFile(model string, seq fingerprint.Sequence) []byte {
	enc := fleet.EncodeSequence(seq)
	b := make([]byte, 0, len(seqMagic)+4+len(model)+len(enc)+4)
	b = append(b, seqMagic...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(model)))
	b = append(b, model...)
	b = append(b, enc...)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, seqCRC))
}

// decodeSequenceFile parses and bounds a sequence file: the model name (at
// most chunkstore.MaxModelLen bytes) and the sequence.
func decodeSequenceFile(b []byte) (string, fingerprint.Sequence, error) {
	var seq fingerprint.Sequence
	if len(b) < len(seqMagic)+8 || string(b[:len(seqMagic)]) != seqMagic ||
		crc32.Checksum(b[:len(b)-4], seqCRC) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
		return "", seq, errBadSequenceFile
	}
	b = b[len(seqMagic) : len(b)-4]
	n := binary.LittleEndian.Uint32(b)
	if n == 0 || n > chunkstore.MaxModelLen || int(n) > len(b)-4 {
		return "", seq, errBadSequenceFile
	}
	model := string(b[4 : 4+n])
	seq, err := fleet.DecodeSequence(b[4+n:])
	if err != nil {
		return "", seq, fmt.Errorf("%w: %w", errBadSequenceFile, err)
	}
	return model, seq, nil
}

// seqDir is the directory of the registered sequences, "" without L2.
func (s *Server) seqDir() string {
	if s.cfg.L2Dir == "" {
		return ""
	}
	return filepath.Join(s.cfg.L2Dir, seqDirName)
}

// maxPendingSequences bounds the sequences whose file waits for room.
const maxPendingSequences = 1024

// pendingSeq is a registered sequence whose file is not written yet.
type pendingSeq struct {
	model string
	seq   fingerprint.Sequence
}

// persistSequence writes a registered sequence next to its chunks (when
// the server has an L2), atomically, once; a failed write keeps it
// pending (at most maxPendingSequences, the oldest dropped and logged),
// written again after the next sequence write that succeeds.
func (s *Server) persistSequence(model string, seq fingerprint.Sequence) {
	if s.seqDir() == "" || len(seq.Keys) == 0 {
		return
	}
	if !s.durable(seq) {
		// Its chunks are in memory only (their L2 writes failed): a file
		// now would be dropped by a restart; written once they are durable.
		s.seqPending.add(pendingSeq{model, seq})
		return
	}
	if err := s.writeSequence(model, seq); err != nil {
		dropped := s.seqPending.add(pendingSeq{model, seq})
		s.logger.Error("sequence not kept in L2 (kept pending: written again once a write succeeds)", "model", model, "err", err,
			"disk_full", chunkstore.IsDiskFull(err))
		if dropped > 0 {
			s.logger.Error("pending sequences dropped: a restart will not match them", "sequences", dropped)
		}
		return
	}
	for _, p := range s.seqPending.take() {
		if !s.durable(p.seq) || s.writeSequence(p.model, p.seq) != nil {
			if s.anyGone(p.seq) {
				continue // a chunk left every tier: the sequence cannot come back
			}
			s.seqPending.add(p)
		}
	}
}

// durable reports whether every chunk of seq is in L2.
func (s *Server) durable(seq fingerprint.Sequence) bool {
	for _, k := range seq.Keys {
		if !s.chunks.store.Durable(k) {
			return false
		}
	}
	return true
}

// anyGone reports whether a chunk of seq is held by no tier.
func (s *Server) anyGone(seq fingerprint.Sequence) bool {
	for _, k := range seq.Keys {
		if s.chunks.store.Contains(k) == chunkstore.TierNone {
			return true
		}
	}
	return false
}

// writeSequence writes seq's file unless it exists.
func (s *Server) writeSequence(model string, seq fingerprint.Sequence) error {
	dir := s.seqDir()
	path := filepath.Join(dir, seq.Keys[len(seq.Keys)-1].String()+seqExt)
	if _, err := os.Lstat(path); err == nil {
		return nil
	}
	return writeFileAtomic(dir, path, encodeSequenceFile(model, seq))
}

// seqQueue is the bounded list of pending sequences. Safe for concurrent
// use.
type seqQueue struct {
	mu   sync.Mutex
	list []pendingSeq
}

// add appends p, dropping the oldest beyond maxPendingSequences; it
// returns how many it dropped.
func (q *seqQueue) add(p pendingSeq) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.list = append(q.list, p)
	n := max(0, len(q.list)-maxPendingSequences)
	q.list = q.list[n:]
	return n
}

func (q *seqQueue) take() []pendingSeq {
	q.mu.Lock()
	defer q.mu.Unlock()
	l := q.list
	q.list = nil
	return l
}

func (q *seqQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.list)
}

// writeFileAtomic writes b to path through a temporary file in dir (0600;
// dir made by chunkstore.MakeDir: never through a symbolic link).
func writeFileAtomic(dir, path string, b []byte) error {
	if err := chunkstore.MakeDir(dir); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".seq-*")
	if err != nil {
		return err
	}
	_, werr := tmp.Write(b)
	if err := errors.Join(werr, tmp.Close()); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return nil
}

// restoreSequences registers again, at start-up, the sequences kept in L2
// whose chunks are all still there and removes the other files; it returns
// how many it registered.
func (s *Server) restoreSequences() (int, error) {
	dir := s.seqDir()
	if dir == "" {
		return 0, nil
	}
	if err := chunkstore.MakeDir(dir); err != nil {
		return 0, fmt.Errorf("blend: sequences directory: %w", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("blend: sequences directory: %w", err)
	}
	restored, incomplete, corrupt := 0, 0, 0
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		if !e.Type().IsRegular() {
			continue
		}
		if !strings.HasSuffix(e.Name(), seqExt) {
			if isSeqTemp(e.Name()) {
				os.Remove(path) // an interrupted write of this server's
			}
			continue
		}
		model, seq, err := readSequenceFile(path)
		if err != nil {
			// Not removed: a file that does not decode may not be ours.
			corrupt++
			qerr := os.Rename(path, path+".corrupt")
			s.logger.Error("sequence file in L2 does not decode: renamed aside, not registered", "file", e.Name(), "err", err, "rename_err", qerr)
			continue
		}
		for _, k := range seq.Keys {
			if s.chunks.store.Contains(k) == chunkstore.TierNone {
				err = fmt.Errorf("chunk %s is gone", k)
				break
			}
		}
		if err == nil {
			_, err = s.chunks.table(model, true).Register(seq)
		}
		if err != nil {
			// Ours (it decoded), useless without its chunks.
			incomplete++
			s.logger.Warn("sequence in L2 dropped", "file", e.Name(), "err", err)
			os.Remove(path)
			continue
		}
		restored++
	}
	if incomplete > 0 || corrupt > 0 {
		s.logger.Error("sequences in L2 not restored", "restored", restored, "chunks_missing", incomplete, "corrupt", corrupt)
	}
	return restored, nil
}

// isSeqTemp reports whether name is a temp file of writeFileAtomic
// (".seq-" and CreateTemp's random digits).
func isSeqTemp(name string) bool {
	rest, ok := strings.CutPrefix(name, ".seq-")
	return ok && rest != "" && strings.Trim(rest, "0123456789") == ""
}

// readSequenceFile reads and decodes one sequence file, at most
// MaxSequenceFileBytes.
func readSequenceFile(path string) (string, fingerprint.Sequence, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return "", fingerprint.Sequence{}, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxSequenceFileBytes+1))
	if err != nil {
		return "", fingerprint.Sequence{}, err
	}
	if len(b) > MaxSequenceFileBytes {
		return "", fingerprint.Sequence{}, fmt.Errorf("%w: over %d bytes", errBadSequenceFile, MaxSequenceFileBytes)
	}
	return decodeSequenceFile(b)
}

// The storage state of stored documents, asked for by the engine before it
// answers POST /v1/documents (BlendService.StoreStatus). It follows the
// CB_STORE_START and CB_STORE_END events of document stores on the event
// bus: an END's error says which chunks missed which tier.

// Document storage states (cbv1.StoreState.state).
const (
	StoreStored     = "stored"
	StoreMemoryOnly = "memory_only"
	StoreFailed     = "failed"
	StoreUnknown    = "unknown"
)

// storeDocs follows the stores of the documents stored recently, by
// request id (at most MaxFleetDocuments; the oldest are forgotten). Safe
// for concurrent use.
type storeDocs struct {
	logger  *slog.Logger // set before the bus starts
	mu      sync.Mutex
	failing bool // the last document store's L2 writes failed (logged once per episode)
	byID    map[string]*storeDoc
	order   []string
	changed chan struct{} // closed and replaced on every change
}

type storeDoc struct {
	started, ended int
	state          string // worst so far: stored < memory_only < failed
	err            string
}

var stateRank = map[string]int{StoreStored: 0, StoreMemoryOnly: 1, StoreFailed: 2}

// EventTypes are the events storeDocs follows.
func (d *storeDocs) EventTypes() []events.EventType {
	return []events.EventType{events.StoreStart, events.StoreEnd}
}

// HandleEvent records a document store's start or end; the first store
// whose L2 writes fail after one that succeeded is logged as an error
// (with the cause: a full disk), and the recovery.
func (d *storeDocs) HandleEvent(ev events.Event) {
	var state, msg string
	if ev.Type == events.StoreEnd {
		state, msg = classifyStoreErr(ev.Err)
	}
	logFail, logOK := d.record(ev, state, msg)
	switch {
	case logFail && d.logger != nil:
		d.logger.Error("documents not durable: L2 write failed; they are held in memory only and lost by a restart until the disk has room",
			"request_id", ev.RequestID, "state", state, "err", msg)
	case logOK && d.logger != nil:
		d.logger.Info("L2 writes succeed again", "request_id", ev.RequestID)
	}
}

// record applies ev under the lock; it reports a change of the L2 writes'
// health (to log).
func (d *storeDocs) record(ev events.Event, state, msg string) (failing, recovered bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e := d.byID[ev.RequestID]
	switch ev.Type {
	case events.StoreStart:
		if !isDocument(ev.Attrs) {
			return
		}
		if e == nil {
			if d.byID == nil {
				d.byID = make(map[string]*storeDoc)
			}
			for len(d.order) >= MaxFleetDocuments {
				delete(d.byID, d.order[0])
				d.order[0] = ""
				d.order = d.order[1:]
			}
			e = &storeDoc{state: StoreStored}
			d.byID[ev.RequestID] = e
			d.order = append(d.order, ev.RequestID)
		}
		e.started++
	case events.StoreEnd:
		if e == nil {
			return
		}
		e.ended++
		if stateRank[state] > stateRank[e.state] {
			e.state, e.err = state, msg
		}
		bad := state != StoreStored
		failing, recovered = bad && !d.failing, !bad && d.failing
		d.failing = bad
	}
	if d.changed != nil {
		close(d.changed)
		d.changed = nil
	}
	return failing, recovered
}

func isDocument(attrs []attribute.KeyValue) bool {
	for _, a := range attrs {
		if a.Key == "document" {
			return a.Value.AsBool()
		}
	}
	return false
}

// classifyStoreErr is the state a store's error leaves its document in:
// stored (nil), memory_only (every failure an L2 write of a chunk still in
// L1) or failed; and the failure's cause for the answer.
func classifyStoreErr(err error) (string, string) {
	if err == nil {
		return StoreStored, ""
	}
	state, msg := StoreMemoryOnly, ""
	walkErrs(err, func(e error) bool {
		var we *chunkstore.L2WriteError
		if errors.As(e, &we) {
			if msg == "" {
				msg = rootCause(we.Err)
			}
			if !we.InL1 {
				state = StoreFailed
			}
			return true
		}
		state, msg = StoreFailed, e.Error()
		return false
	})
	return state, msg
}

// walkErrs calls f on each leaf-level error of a joined error (errors.Join
// of per-chunk errors); f returns false to stop.
func walkErrs(err error, f func(error) bool) bool {
	if j, ok := err.(interface{ Unwrap() []error }); ok && !isL2WriteError(err) {
		for _, e := range j.Unwrap() {
			if !walkErrs(e, f) {
				return false
			}
		}
		return true
	}
	var we *chunkstore.L2WriteError
	if errors.As(err, &we) || errors.Unwrap(err) == nil {
		return f(err)
	}
	return walkErrs(errors.Unwrap(err), f)
}

func isL2WriteError(err error) bool {
	_, ok := err.(*chunkstore.L2WriteError)
	return ok
}

// rootCause is the innermost error's text ("no space left on device").
func rootCause(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	return err.Error()
}

// wait returns the states of ids once each one's stores ended (or ctx
// ends: the others are StoreUnknown).
func (d *storeDocs) wait(ctx context.Context, ids []string) ([]string, []string) {
	states, errs := make([]string, len(ids)), make([]string, len(ids))
	for {
		d.mu.Lock()
		done := true
		for i, id := range ids {
			e := d.byID[id]
			if e == nil || e.ended < e.started || e.ended == 0 {
				states[i], errs[i], done = StoreUnknown, "", false
				continue
			}
			states[i], errs[i] = e.state, e.err
		}
		if done {
			d.mu.Unlock()
			return states, errs
		}
		if d.changed == nil {
			d.changed = make(chan struct{})
		}
		ch := d.changed
		d.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return states, errs
		}
	}
}

// storeStatus answers BlendService.StoreStatus.
func (s *Server) storeStatus(ctx context.Context, r *cbv1.StoreStatusRequest) (*cbv1.StoreStatusResponse, error) {
	ids := r.GetRequestIds()
	if len(ids) == 0 || len(ids) > MaxFleetStatusIDs {
		return nil, status.Errorf(codes.InvalidArgument, "store status: %d document ids (want 1..%d)", len(ids), MaxFleetStatusIDs)
	}
	for _, id := range ids {
		if err := checkRequest("store status", id, -1); err != nil {
			return nil, err
		}
	}
	wctx, cancel := context.WithTimeout(ctx, s.cfg.FleetStatusWait)
	defer cancel()
	states, errs := s.storeDocs.wait(wctx, ids)
	resp := &cbv1.StoreStatusResponse{L2: s.cfg.L2Dir != "", DiskFull: s.chunks.store.Stats().DiskFull}
	for i := range ids {
		resp.States = append(resp.States, &cbv1.StoreState{State: states[i], Error: errs[i]})
	}
	return resp, nil
}

// StorageHealth is the L2's state for /health (cb blend adds it as a
// detail line): "" when the server has no L2 or its writes succeed, else
// what failed and what is not durable. Safe for concurrent use.
func (s *Server) StorageHealth() string {
	if s.cfg.L2Dir == "" {
		return ""
	}
	st := s.chunks.store.Stats()
	pendingSeqs := s.seqPending.len()
	switch {
	case st.DiskFull:
		return fmt.Sprintf("DISK FULL: chunk files not written (%s); %d chunks and %d sequences held in memory only until a write succeeds", st.LastWriteError, st.PendingL2, pendingSeqs)
	case st.LastWriteError != "":
		return fmt.Sprintf("write failing: %s; %d chunks and %d sequences held in memory only", st.LastWriteError, st.PendingL2, pendingSeqs)
	case st.PendingL2 > 0 || pendingSeqs > 0:
		return fmt.Sprintf("catching up: %d chunks and %d sequences not written yet", st.PendingL2, pendingSeqs)
	}
	return fmt.Sprintf("ok: %d chunk files, %d bytes of a budget of %d (0: unbounded)", st.L2Chunks, st.L2Bytes, st.L2Budget)
}

// setStorageMetrics mirrors the L2's state into m (before each scrape).
func (s *Server) setStorageMetrics(m *metrics.StorageMetrics) {
	st := s.chunks.store.Stats()
	m.Set(metrics.StorageHealth{DiskFull: st.DiskFull, PendingChunks: int64(st.PendingL2), Budget: st.L2Budget})
}
