package blend

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cacheblend/cacheblend/blend/chunkstore"
	"github.com/cacheblend/cacheblend/kvcache"
	"github.com/cacheblend/cacheblend/rope"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
)

// The name pattern of the shared-memory files kvcache.Create makes
// (cb-kv-<pid>-<random>.shm); RegisterKV maps no other file.
const (
	shmPrefix = "cb-kv-"
	shmSuffix = ".shm"
)

type workerKey struct {
	id   string
	rank int
}

// workerMem is one registered worker KV memory. refs, retired and lastSeen
// are guarded by Server.wmu; the rest is immutable.
type workerMem struct {
	key    workerKey
	path   string
	fileID fileID
	layout kvcache.Layout
	theta  float64
	model  string
	mem    *kvcache.Memory
	rope   *rope.RoPE

	refs     int
	retired  bool
	lastSeen time.Time
}

type fileID struct{ dev, ino uint64 }

// statShm checks that path names a regular shared-memory file made by
// kvcache.Create (not a symlink) and returns its identity.
func statShm(path string) (fileID, error) {
	base := filepath.Base(path)
	if !filepath.IsAbs(path) || !strings.HasPrefix(base, shmPrefix) || !strings.HasSuffix(base, shmSuffix) {
		return fileID{}, fmt.Errorf("shm_path %q is not an absolute path to a %s*%s file", path, shmPrefix, shmSuffix)
	}
	fi, err := os.Lstat(path)
	if err != nil {
		return fileID{}, fmt.Errorf("shm_path: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return fileID{}, fmt.Errorf("shm_path %q is not a regular file", path)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}, nil
	}
	return fileID{dev: uint64(st.Dev), ino: st.Ino}, nil
}

// layoutOf validates a registered layout.
func layoutOf(l *cbv1.KVLayout) (kvcache.Layout, float64, error) {
	if l == nil {
		return kvcache.Layout{}, 0, errors.New("missing layout")
	}
	kl := kvcache.Layout{
		NumLayers: int(l.GetNumLayers()), NumBlocks: int(l.GetNumBlocks()), BlockSize: int(l.GetBlockSize()),
		KVHeads: int(l.GetKvHeads()), HeadDim: int(l.GetHeadDim()),
	}
	if err := kl.Validate(); err != nil {
		return kl, 0, err
	}
	cl := chunkstore.LayoutOf(kl, l.GetRopeTheta())
	if err := cl.Validate(); err != nil {
		return kl, 0, err
	}
	if kl.HeadDim%2 != 0 {
		return kl, 0, fmt.Errorf("head_dim %d is odd (RoPE needs an even head dimension)", kl.HeadDim)
	}
	theta := l.GetRopeTheta()
	if math.IsNaN(theta) || math.IsInf(theta, 0) || theta < 0 {
		return kl, 0, fmt.Errorf("rope_theta %v", theta)
	}
	if theta == 0 {
		theta = rope.DefaultTheta
	}
	return kl, theta, nil
}

func (s *Server) registerKV(_ context.Context, r *cbv1.RegisterKVRequest) (*cbv1.RegisterKVResponse, error) {
	if r.GetWorkerId() == "" {
		return nil, status.Error(codes.InvalidArgument, "register: missing worker_id")
	}
	if r.GetRank() < 0 {
		return nil, status.Errorf(codes.InvalidArgument, "register: negative rank %d", r.GetRank())
	}
	if len(r.GetModel()) > chunkstore.MaxModelLen {
		return nil, status.Errorf(codes.InvalidArgument, "register: model name of %d bytes", len(r.GetModel()))
	}
	layout, theta, err := layoutOf(r.GetLayout())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "register: bad layout: %v", err)
	}
	fid, err := statShm(r.GetShmPath())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "register: %v", err)
	}
	key := workerKey{r.GetWorkerId(), int(r.GetRank())}
	resp := &cbv1.RegisterKVResponse{ServerEpoch: s.epoch}
	now := s.now()

	same := func(w *workerMem) bool {
		return w != nil && w.path == r.GetShmPath() && w.fileID == fid && w.layout == layout &&
			w.theta == theta && w.model == r.GetModel()
	}
	s.wmu.Lock()
	if w := s.workers[key]; same(w) {
		w.lastSeen = now
		s.wmu.Unlock()
		return resp, nil
	}
	s.wmu.Unlock()

	mem, err := kvcache.Open(r.GetShmPath(), layout)
	if err != nil {
		code := codes.Internal
		if errors.Is(err, kvcache.ErrBadLayout) || errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
			code = codes.InvalidArgument
		}
		return nil, status.Errorf(code, "register: %v", err)
	}
	nw := &workerMem{
		key: key, path: r.GetShmPath(), fileID: fid, layout: layout, theta: theta, model: r.GetModel(),
		mem: mem, rope: rope.New(layout.HeadDim, theta), lastSeen: now,
	}
	var toClose []*kvcache.Memory
	s.wmu.Lock()
	old := s.workers[key]
	raced := same(old) // registered concurrently: keep that mapping
	if raced {
		old.lastSeen = now
		toClose = append(toClose, mem)
	} else {
		s.workers[key] = nw
		if old != nil && s.retireLocked(old) {
			toClose = append(toClose, old.mem)
		}
	}
	s.wmu.Unlock()
	for _, m := range toClose {
		m.Close()
	}
	if !raced {
		s.logger.Info("worker KV memory registered", "worker_id", key.id, "rank", key.rank, "shm", nw.path,
			"replaced", old != nil, "layers", layout.NumLayers, "blocks", layout.NumBlocks)
	}
	return resp, nil
}

// retireLocked marks w replaced and reports whether it can be unmapped now
// (no RPC holds it). Caller holds wmu.
func (s *Server) retireLocked(w *workerMem) bool {
	if w.retired {
		return false
	}
	w.retired = true
	return w.refs == 0
}

// acquire returns the registered memory of (id, rank) with a reference the
// caller must release, or nil.
func (s *Server) acquire(id string, rank int) *workerMem {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	w := s.workers[workerKey{id, rank}]
	if w != nil {
		w.refs++
	}
	return w
}

func (s *Server) release(w *workerMem) {
	s.wmu.Lock()
	w.refs--
	closeNow := w.retired && w.refs == 0
	s.wmu.Unlock()
	if closeNow {
		w.mem.Close()
	}
}

// expireWorkers drops registrations not renewed within RegistrationTTL.
func (s *Server) expireWorkers(now time.Time) {
	var toClose []*workerMem
	s.wmu.Lock()
	for k, w := range s.workers {
		if now.Sub(w.lastSeen) >= s.cfg.RegistrationTTL {
			delete(s.workers, k)
			s.regsExpired.Add(1)
			if s.retireLocked(w) {
				toClose = append(toClose, w)
			}
		}
	}
	s.wmu.Unlock()
	for _, w := range toClose {
		w.mem.Close()
		s.logger.Info("worker KV registration expired", "worker_id", w.key.id, "rank", w.key.rank)
	}
}

// releaseAllWorkers forgets every registration, unmapping those no RPC
// holds (the others are unmapped by their last release).
func (s *Server) releaseAllWorkers() {
	var toClose []*workerMem
	s.wmu.Lock()
	for k, w := range s.workers {
		delete(s.workers, k)
		if s.retireLocked(w) {
			toClose = append(toClose, w)
		}
	}
	s.wmu.Unlock()
	for _, w := range toClose {
		w.mem.Close()
	}
}

// enqueue puts v on the bounded queue q without waiting: false when the
// server is not running or q is full (the caller drops and counts). The
// gate's read lock keeps Shutdown from closing q meanwhile.
func enqueue[T any](s *Server, q chan T, v T) bool {
	s.gateMu.RLock()
	defer s.gateMu.RUnlock()
	if s.state != stateRunning {
		return false
	}
	select {
	case q <- v:
		return true
	default:
		return false
	}
}
