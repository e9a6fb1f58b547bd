package blend

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cacheblend/cacheblend/blend/chunkstore"
	"github.com/cacheblend/cacheblend/kvcache"
	"github.com/cacheblend/cacheblend/rope"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
	"github.com/cacheblend/cacheblend/rpc/kvsock"
)

// TokenBytes is the length of a registration token (256 random bits).
const TokenBytes = 32

// registrations is the part of a Server that owns the workers' KV
// memories: the KV socket, its connections, and the registrations they
// hold. mu guards every field but the counters.
type registrations struct {
	mu       sync.Mutex
	workers  map[workerKey]*workerMem
	ln       *kvsock.Listener
	conns    map[*kvsock.Conn]struct{} // open connections, registered or handshaking
	perPeer  map[int32]int             // open connections per peer pid
	closed   bool
	refusing chan struct{} // semaphore of refuseKV's goroutines

	refused, released atomic.Uint64
}

func newRegistrations() registrations {
	return registrations{
		workers: make(map[workerKey]*workerMem), conns: make(map[*kvsock.Conn]struct{}),
		perPeer: make(map[int32]int), refusing: make(chan struct{}, maxRefusing),
	}
}

type workerKey struct {
	id   string
	rank int
}

// workerMem is one registered worker KV memory: the mapping of the
// descriptor its peer handed over on the KV socket, bound to that
// connection and to a random token. refs and retired are guarded by
// registrations.mu; the rest is immutable.
type workerMem struct {
	key    workerKey
	token  [TokenBytes]byte
	conn   *kvsock.Conn // the registration lives as long as it
	peer   kvsock.Cred
	layout kvcache.Layout
	theta  float64
	model  string
	world  int // tensor-parallel world size (1 for a whole-model worker)
	mem    *kvcache.Memory
	rope   *rope.RoPE

	refs    int
	retired bool
}

// layoutOf validates a registered layout.
func layoutOf(l *cbv1.KVLayout) (kvcache.Layout, float64, error) {
	if l == nil {
		return kvcache.Layout{}, 0, errors.New("missing layout")
	}
	dt, err := kvcache.ParseDType(cmp.Or(l.GetDtype(), "f32"))
	if err != nil {
		return kvcache.Layout{}, 0, err
	}
	kl := kvcache.Layout{
		NumLayers: int(l.GetNumLayers()), NumBlocks: int(l.GetNumBlocks()), BlockSize: int(l.GetBlockSize()),
		KVHeads: int(l.GetKvHeads()), HeadDim: int(l.GetHeadDim()), DType: dt,
	}
	if err := kl.Validate(); err != nil {
		return kl, 0, err
	}
	theta := l.GetRopeTheta()
	if err := chunkstore.LayoutOf(kl, theta).Validate(); err != nil { // dimensions, and a finite non-negative theta
		return kl, 0, err
	}
	if kl.HeadDim%2 != 0 {
		return kl, 0, fmt.Errorf("head_dim %d is odd (RoPE needs an even head dimension)", kl.HeadDim)
	}
	if theta == 0 {
		theta = rope.DefaultTheta
	}
	return kl, theta, nil
}

// acceptKV accepts connections on the KV socket until it is closed. The
// connection limits (Config.MaxKVRegistrations, MaxKVRegistrationsPerPeer)
// are checked before a goroutine is spent on a connection.
func (s *Server) acceptKV(ln *kvsock.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			s.regs.mu.Lock()
			closed := s.regs.closed
			s.regs.mu.Unlock()
			if closed {
				return
			}
			s.logger.Warn("KV socket: accept failed", "err", err)
			select { // e.g. out of descriptors: do not spin
			case <-s.life.stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		pid := c.Peer().PID
		s.regs.mu.Lock()
		var refuse string
		switch {
		case s.regs.closed:
			refuse = "blend server shutting down"
		case len(s.regs.conns) >= s.cfg.MaxKVRegistrations:
			refuse = fmt.Sprintf("%d KV registrations, the server's limit", s.cfg.MaxKVRegistrations)
		case s.regs.perPeer[pid] >= s.cfg.MaxKVRegistrationsPerPeer:
			refuse = fmt.Sprintf("process %d holds %d KV registrations, the per-peer limit", pid, s.cfg.MaxKVRegistrationsPerPeer)
		default:
			s.regs.conns[c] = struct{}{}
			s.regs.perPeer[pid]++
		}
		s.regs.mu.Unlock()
		if refuse != "" {
			s.regs.refused.Add(1)
			s.refuseKV(c, codes.ResourceExhausted, refuse)
			continue
		}
		s.life.bg.Go(func() { s.serveKV(c) })
	}
}

// maxRefusing bounds the goroutines answering refused connections; beyond
// it a refused connection is closed without an answer.
const maxRefusing = 16

// refuseKV answers a connection refused by the limits and closes it, on a
// goroutine of its own (at most maxRefusing at a time): the peer's message
// is read first (its descriptors closed), for a connection closed with
// unread data would reset the peer before it reads the answer.
func (s *Server) refuseKV(c *kvsock.Conn, code codes.Code, msg string) {
	select {
	case s.regs.refusing <- struct{}{}:
	default:
		c.Close()
		return
	}
	s.life.bg.Go(func() {
		defer func() { <-s.regs.refusing }()
		defer c.Close()
		var r cbv1.KVRegistration
		files, _ := c.Recv(time.Now().Add(min(s.cfg.KVHandshakeTimeout, time.Second)), &r)
		for _, f := range files {
			f.Close()
		}
		s.replyKV(c, code, msg, nil)
	})
}

// replyKV sends the answer of a registration (best effort: a peer that is
// gone gets nothing).
func (s *Server) replyKV(c *kvsock.Conn, code codes.Code, msg string, w *workerMem) {
	r := &cbv1.KVRegistered{Code: int32(code), Message: msg, ServerEpoch: s.epoch}
	if w != nil {
		r.RegistrationToken = w.token[:]
	}
	if err := c.Send(time.Now().Add(s.cfg.KVHandshakeTimeout), r, nil); err != nil && code == codes.OK {
		s.logger.Warn("KV socket: answer not sent", "err", err)
	}
}

// serveKV runs one connection of the KV socket: checks the peer, receives
// its registration and descriptor, maps the memory, answers with a token,
// then holds the registration until the connection closes.
func (s *Server) serveKV(c *kvsock.Conn) {
	var mine *workerMem
	defer func() {
		c.Close()
		s.regs.mu.Lock()
		delete(s.regs.conns, c)
		if pid := c.Peer().PID; s.regs.perPeer[pid] <= 1 {
			delete(s.regs.perPeer, pid)
		} else {
			s.regs.perPeer[pid]--
		}
		unmap := s.regs.dropLocked(mine)
		s.regs.mu.Unlock()
		if unmap {
			mine.mem.Close()
		}
	}()
	peer := c.Peer()
	w, code, err := s.receiveKV(c)
	if err != nil {
		s.regs.refused.Add(1)
		s.logger.Warn("KV registration refused", "pid", peer.PID, "code", code.String(), "err", err)
		s.replyKV(c, code, err.Error(), nil)
		return
	}
	// Register: a registration of the same (worker, rank) is replaced (a
	// restarted worker); its connection is closed, its mapping released
	// once no RPC holds it.
	s.regs.mu.Lock()
	if s.regs.closed {
		s.regs.mu.Unlock()
		w.mem.Close()
		s.replyKV(c, codes.Unavailable, "blend server shutting down", nil)
		return
	}
	old := s.regs.workers[w.key]
	unmapOld := s.regs.dropLocked(old)
	s.regs.workers[w.key] = w
	mine = w
	s.regs.mu.Unlock()
	if old != nil {
		old.conn.Close()
	}
	if unmapOld {
		old.mem.Close()
	}
	s.replyKV(c, codes.OK, "", w)
	s.logger.Info("worker KV memory registered", "worker_id", w.key.id, "rank", w.key.rank, "pid", peer.PID,
		"memory", w.mem.Name(), "sealed", w.mem.Sealed(), "replaced", old != nil,
		"layers", w.layout.NumLayers, "blocks", w.layout.NumBlocks)
	err = c.WaitClosed()
	s.regs.mu.Lock()
	current := s.regs.workers[w.key] == w
	s.regs.mu.Unlock()
	if current {
		s.logger.Info("worker KV registration released (connection closed)", "worker_id", w.key.id, "rank", w.key.rank, "pid", peer.PID, "err", err)
	}
}

// receiveKV reads a connection's registration within KVHandshakeTimeout,
// checks every field against the limits and maps the descriptor that came
// with it; the error's code is the answer's. The message is read before the
// peer's user is checked (a connection closed with unread data would reset
// the peer before it reads the answer).
func (s *Server) receiveKV(c *kvsock.Conn) (*workerMem, codes.Code, error) {
	var r cbv1.KVRegistration
	files, err := c.Recv(time.Now().Add(s.cfg.KVHandshakeTimeout), &r)
	defer func() {
		for _, f := range files {
			f.Close() // the mapping holds the memory
		}
	}()
	if !c.SameUser() {
		return nil, codes.PermissionDenied, fmt.Errorf("peer uid %d is not the server's uid %d", c.Peer().UID, os.Geteuid())
	}
	if err != nil {
		return nil, codes.InvalidArgument, err
	}
	switch {
	case len(files) != 1:
		return nil, codes.InvalidArgument, fmt.Errorf("registration carries %d descriptors, want 1", len(files))
	case r.GetWorkerId() == "" || len(r.GetWorkerId()) > MaxWorkerIDLen:
		return nil, codes.InvalidArgument, fmt.Errorf("worker_id of %d bytes (want 1..%d)", len(r.GetWorkerId()), MaxWorkerIDLen)
	case r.GetRank() < 0 || r.GetRank() >= MaxWorldSize:
		return nil, codes.InvalidArgument, fmt.Errorf("rank %d outside [0,%d)", r.GetRank(), MaxWorldSize)
	case len(r.GetModel()) > chunkstore.MaxModelLen:
		return nil, codes.InvalidArgument, fmt.Errorf("model name of %d bytes", len(r.GetModel()))
	case r.GetWorldSize() < 0 || r.GetWorldSize() > MaxWorldSize || r.GetRank() >= max(1, r.GetWorldSize()):
		return nil, codes.InvalidArgument, fmt.Errorf("rank %d of world size %d (want 0 <= rank < world size <= %d)", r.GetRank(), r.GetWorldSize(), MaxWorldSize)
	}
	layout, theta, err := layoutOf(r.GetLayout())
	if err != nil {
		return nil, codes.InvalidArgument, fmt.Errorf("bad layout: %w", err)
	}
	ro := rope.New(layout.HeadDim, theta)
	if inv := r.GetLayout().GetRopeInvFreq(); len(inv) > 0 {
		if ro, err = rope.FromInvFreq(layout.HeadDim, inv); err != nil {
			return nil, codes.InvalidArgument, fmt.Errorf("bad layout: %w", err)
		}
	}
	mem, err := kvcache.Map(files[0], layout)
	if err != nil {
		return nil, codes.InvalidArgument, err
	}
	w := &workerMem{
		key: workerKey{r.GetWorkerId(), int(r.GetRank())}, conn: c, peer: c.Peer(),
		layout: layout, theta: theta, model: r.GetModel(), world: max(1, int(r.GetWorldSize())), mem: mem, rope: ro,
	}
	if _, err := rand.Read(w.token[:]); err != nil {
		mem.Close()
		return nil, codes.Internal, fmt.Errorf("registration token: %w", err)
	}
	return w, codes.OK, nil
}

// dropLocked forgets w (nil: nothing) when it is still the registration of
// its key, counting the release, and reports whether it can be unmapped now.
// Caller holds registrations.mu.
func (r *registrations) dropLocked(w *workerMem) bool {
	if w == nil || r.workers[w.key] != w {
		return false
	}
	delete(r.workers, w.key)
	r.released.Add(1)
	return r.retireLocked(w)
}

// retireLocked marks w replaced and reports whether it can be unmapped now
// (no RPC holds it). Caller holds registrations.mu.
func (r *registrations) retireLocked(w *workerMem) bool {
	if w.retired {
		return false
	}
	w.retired = true
	return w.refs == 0
}

// acquire returns the registered memory of (id, rank) with a reference the
// caller must release, when token is that registration's (compared in
// constant time). Otherwise a gRPC error: PermissionDenied without a
// well-formed token or with another one, FailedPrecondition when nothing
// is registered under (id, rank).
func (r *registrations) acquire(op, id string, rank int, token []byte) (*workerMem, error) {
	if id == "" || len(id) > MaxWorkerIDLen || rank < 0 || rank >= MaxWorldSize {
		return nil, status.Errorf(codes.InvalidArgument, "%s: bad worker_id (%d bytes) / rank %d", op, len(id), rank)
	}
	if len(token) != TokenBytes {
		return nil, status.Errorf(codes.PermissionDenied, "%s: missing or malformed registration_token", op)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	w := r.workers[workerKey{id, rank}]
	if w == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "%s: worker %q rank %d has no KV memory registered (register on the KV socket first)", op, id, rank)
	}
	if subtle.ConstantTimeCompare(w.token[:], token) != 1 {
		return nil, status.Errorf(codes.PermissionDenied, "%s: registration_token does not match worker %q rank %d's registration", op, id, rank)
	}
	w.refs++
	return w, nil
}

func (r *registrations) release(w *workerMem) {
	r.mu.Lock()
	w.refs--
	closeNow := w.retired && w.refs == 0
	r.mu.Unlock()
	if closeNow {
		w.mem.Close()
	}
}

// unregisterKV releases the caller's registration (by its token) and
// closes its connection.
func (s *Server) unregisterKV(_ context.Context, r *cbv1.UnregisterKVRequest) (*cbv1.UnregisterKVResponse, error) {
	w, err := s.regs.acquire("unregister", r.GetWorkerId(), int(r.GetRank()), r.GetRegistrationToken())
	if err != nil {
		return nil, err
	}
	s.regs.mu.Lock()
	s.regs.dropLocked(w) // unmapped by the release below
	s.regs.mu.Unlock()
	s.regs.release(w)
	w.conn.Close()
	s.logger.Info("worker KV registration released (unregistered)", "worker_id", w.key.id, "rank", w.key.rank, "pid", w.peer.PID)
	return &cbv1.UnregisterKVResponse{}, nil
}

// closeKV stops the KV socket: no new connection is accepted, every
// connection is closed (their goroutines release their registrations).
func (s *Server) closeKV() {
	s.regs.mu.Lock()
	s.regs.closed = true
	conns := make([]*kvsock.Conn, 0, len(s.regs.conns))
	for c := range s.regs.conns {
		conns = append(conns, c)
	}
	s.regs.mu.Unlock()
	if s.regs.ln != nil {
		s.regs.ln.Close()
	}
	for _, c := range conns {
		c.Close()
	}
}

// releaseAllWorkers forgets every registration, unmapping those no RPC
// holds (the others are unmapped by their last release).
func (s *Server) releaseAllWorkers() {
	var toClose []*workerMem
	s.regs.mu.Lock()
	for k, w := range s.regs.workers {
		delete(s.regs.workers, k)
		if s.regs.retireLocked(w) {
			toClose = append(toClose, w)
		}
	}
	s.regs.mu.Unlock()
	for _, w := range toClose {
		w.mem.Close()
	}
}

// enqueue puts v on the bounded queue q without waiting: false when the
// server is not running or q is full (the caller drops and counts). The
// gate's read lock keeps Shutdown from closing q meanwhile.
func enqueue[T any](s *Server, q chan T, v T) bool {
	s.life.gateMu.RLock()
	defer s.life.gateMu.RUnlock()
	if s.life.state != stateRunning {
		return false
	}
	select {
	case q <- v:
		return true
	default:
		return false
	}
}
