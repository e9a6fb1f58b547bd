package rankgroup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/cacheblend/cacheblend/rpc/cbv1"
	"github.com/cacheblend/cacheblend/tp"
)

// Descriptors a rank process inherits.
const (
	// SegmentFD is the all-reduce segment (tp.OpenSegment).
	SegmentFD = 3
	// StepFD is the rank's end of its step socket (Follower).
	StepFD = 4
	// MetricsFD is a loopback listener rank 0 opened for the rank's
	// /metrics (MetricsListener), so rank 0 knows where to gather it.
	MetricsFD = 5
)

// RankEnv is the environment variable that tells a rank process its rank
// (added to Config.Env for each rank).
const RankEnv = "CB_TP_RANK"

// ErrGroupFailed reports that the rank group cannot run steps any more (a
// rank died or its step socket broke). The group must be restarted.
var ErrGroupFailed = errors.New("rankgroup: tensor-parallel rank group failed")

// Config sets up a Group; the zero value of every field but World works.
type Config struct {
	// World is the number of ranks, rank 0 (this process) included; 1..tp.MaxWorld.
	World int
	// Path is the rank processes' executable; default os.Executable().
	Path string
	// Env is their environment; default os.Environ().
	Env []string
	// Stdout and Stderr receive their output; default os.Stderr for both
	// (a rank's stdout must not mix with rank 0's READY line).
	Stdout, Stderr io.Writer
	// Reducer configures the all-reduce segment (tp.Config defaults).
	Reducer tp.Config
}

// Local runs a step on rank 0 itself (the worker's own Execute).
type Local func(ctx context.Context, req *cbv1.ExecuteRequest) (*cbv1.ExecuteResponse, error)

// Group is rank 0's side of a rank group: it owns the segment, the rank
// processes and their step sockets. Start it, pass Reducer to rank 0's
// model, run steps with Execute, and Shutdown. Execute calls are serialized;
// Done and Err are safe from any goroutine.
type Group struct {
	cfg    Config
	args   func(rank int) []string
	logger *slog.Logger

	seg     *os.File
	reducer *tp.Reducer
	ranks   []*rankProc

	execMu sync.Mutex
	stored map[string]int // request id -> ranks that reported its store done

	failMu   sync.Mutex
	err      error
	crashed  bool // the group failed before Shutdown
	closing  bool
	done     chan struct{}
	watchers sync.WaitGroup
}

type rankProc struct {
	rank   int
	cmd    *exec.Cmd
	conn   net.Conn
	exited chan struct{}
	// metricsAddr is the loopback address of the listener handed to the
	// rank as MetricsFD.
	metricsAddr string
}

// New returns a Group of cfg.World ranks whose processes run
// cfg.Path with args(rank) (the caller's flags for rank r: the rank must run
// Follower.Serve on StepFD with the reducer of SegmentFD); logger reports
// rank exits. Nothing runs until Start.
func New(cfg Config, args func(rank int) []string, logger *slog.Logger) (*Group, error) {
	if cfg.World < 1 || cfg.World > tp.MaxWorld {
		return nil, fmt.Errorf("rankgroup: world size %d outside 1..%d", cfg.World, tp.MaxWorld)
	}
	if args == nil || logger == nil {
		return nil, errors.New("rankgroup: nil args or logger")
	}
	if cfg.Path == "" {
		p, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("rankgroup: executable: %w", err)
		}
		cfg.Path = p
	}
	if cfg.Env == nil {
		cfg.Env = os.Environ()
	}
	if cfg.Stdout == nil {
		cfg.Stdout = os.Stderr
	}
	if cfg.Stderr == nil {
		cfg.Stderr = os.Stderr
	}
	return &Group{cfg: cfg, args: args, logger: logger, stored: map[string]int{}, done: make(chan struct{})}, nil
}

// Start creates the segment, maps it as rank 0 and starts ranks 1..World-1
// (ctx is not retained: the processes live until Shutdown); when it fails
// nothing is left running.
func (g *Group) Start(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	seg, err := tp.CreateSegment(g.cfg.World, g.cfg.Reducer)
	if err != nil {
		return err
	}
	g.seg = seg
	r, err := tp.OpenSegment(seg, 0, g.cfg.Reducer)
	if err != nil {
		seg.Close()
		return err
	}
	g.reducer = r
	for rank := 1; rank < g.cfg.World; rank++ {
		p, err := g.startRank(rank)
		if err != nil {
			g.Shutdown(context.Background())
			return err
		}
		g.failMu.Lock()
		g.ranks = append(g.ranks, p)
		g.failMu.Unlock()
		r.WatchPeer(rank, p.cmd.Process.Pid)
		g.watchers.Add(1)
		go g.watch(p)
	}
	return nil
}

func (g *Group) startRank(rank int) (*rankProc, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("rankgroup: socketpair: %w", err)
	}
	mine := os.NewFile(uintptr(fds[0]), "rank-step")
	theirs := os.NewFile(uintptr(fds[1]), "rank-step-peer")
	defer theirs.Close()
	conn, err := net.FileConn(mine)
	mine.Close()
	if err != nil {
		return nil, fmt.Errorf("rankgroup: step socket: %w", err)
	}
	mln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("rankgroup: rank %d metrics listener: %w", rank, err)
	}
	defer mln.Close() // the rank holds its own copy
	mfile, err := mln.File()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("rankgroup: rank %d metrics listener: %w", rank, err)
	}
	defer mfile.Close()
	cmd := exec.Command(g.cfg.Path, g.args(rank)...)
	cmd.Env = append(slices.Clone(g.cfg.Env), RankEnv+"="+strconv.Itoa(rank))
	cmd.Stdout, cmd.Stderr = g.cfg.Stdout, g.cfg.Stderr
	cmd.ExtraFiles = []*os.File{g.seg, theirs, mfile} // descriptors 3, 4 and 5
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		conn.Close()
		return nil, fmt.Errorf("rankgroup: start rank %d: %w", rank, err)
	}
	return &rankProc{rank: rank, cmd: cmd, conn: conn, exited: make(chan struct{}), metricsAddr: mln.Addr().String()}, nil
}

// watch reaps a rank process and fails the group when it exits.
func (g *Group) watch(p *rankProc) {
	defer g.watchers.Done()
	err := p.cmd.Wait()
	close(p.exited)
	g.fail(fmt.Errorf("%w: rank %d (pid %d) exited: %v", ErrGroupFailed, p.rank, p.cmd.Process.Pid, err))
}

// fail records the group's first failure, fails the all-reduce of every
// rank, unblocks pending step reads and closes Done.
func (g *Group) fail(err error) {
	g.failMu.Lock()
	first := g.err == nil
	if first {
		g.err = err
		g.crashed = !g.closing
		if g.reducer != nil {
			g.reducer.PeerDied()
		}
		for _, p := range g.ranks {
			p.conn.Close()
		}
		close(g.done)
	}
	closing := g.closing
	g.failMu.Unlock()
	if first && !closing {
		g.logger.Error("tensor-parallel rank group failed", "err", err)
	}
}

// Reducer is rank 0's all-reduce (nil before Start).
func (g *Group) Reducer() tp.AllReducer { return g.reducer }

// World is the group's world size.
func (g *Group) World() int { return g.cfg.World }

// Done is closed when the group failed (a rank died) or was shut down.
func (g *Group) Done() <-chan struct{} { return g.done }

// Err is the group's failure (wrapping ErrGroupFailed), nil while it works.
func (g *Group) Err() error {
	g.failMu.Lock()
	defer g.failMu.Unlock()
	return g.err
}

// Crashed is the group's failure when it failed before Shutdown (a rank
// died), nil otherwise: the process should then exit with an error so that
// its supervisor restarts the whole group.
func (g *Group) Crashed() error {
	g.failMu.Lock()
	defer g.failMu.Unlock()
	if !g.crashed {
		return nil
	}
	return g.err
}

// Execute forwards req to every other rank, runs it locally, waits for
// every rank's answer and returns the local response, whose
// stored_request_ids holds a request only once every rank has reported its
// store done. It returns an error wrapping ErrGroupFailed when a rank is
// gone or its socket broke (the group is then failed for good); a rank's
// own Execute error is logged (rank 0 ran the same checks).
func (g *Group) Execute(ctx context.Context, req *cbv1.ExecuteRequest, local Local) (*cbv1.ExecuteResponse, error) {
	g.execMu.Lock()
	defer g.execMu.Unlock()
	if err := g.Err(); err != nil {
		return nil, err
	}
	payload, err := proto.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("rankgroup: marshal step: %w", err)
	}
	for _, p := range g.ranks {
		if err := WriteFrame(p.conn, KindExecute, payload); err != nil {
			g.fail(fmt.Errorf("%w: rank %d: %w", ErrGroupFailed, p.rank, err))
			return nil, g.Err()
		}
	}
	resp, lerr := local(ctx, req)
	var stored [][]string
	for _, p := range g.ranks {
		if dl, ok := ctx.Deadline(); ok {
			p.conn.SetReadDeadline(dl)
		} else {
			p.conn.SetReadDeadline(time.Time{})
		}
		kind, body, err := ReadFrame(p.conn)
		if err != nil {
			g.fail(fmt.Errorf("%w: rank %d: %w", ErrGroupFailed, p.rank, err))
			return nil, g.Err()
		}
		switch kind {
		case KindResponse:
			var r cbv1.ExecuteResponse
			if err := proto.Unmarshal(body, &r); err != nil {
				g.fail(fmt.Errorf("%w: rank %d: bad response: %w", ErrGroupFailed, p.rank, err))
				return nil, g.Err()
			}
			stored = append(stored, r.GetStoredRequestIds())
		case KindError:
			g.logger.Warn("rank step failed", "rank", p.rank, "err", string(body))
		default:
			g.fail(fmt.Errorf("%w: rank %d answered a frame of kind %#x", ErrGroupFailed, p.rank, kind))
			return nil, g.Err()
		}
	}
	if err := g.Err(); err != nil {
		return nil, err
	}
	if lerr != nil {
		return nil, lerr
	}
	resp.StoredRequestIds = g.mergeStored(resp.GetStoredRequestIds(), stored)
	return resp, nil
}

// mergeStored counts the ranks' store reports; a request is reported once
// all World ranks have.
func (g *Group) mergeStored(local []string, peers [][]string) []string {
	var out []string
	add := func(id string) {
		g.stored[id]++
		if g.stored[id] == g.cfg.World {
			delete(g.stored, id)
			out = append(out, id)
		}
	}
	for _, id := range local {
		add(id)
	}
	for _, ids := range peers {
		for _, id := range ids {
			add(id)
		}
	}
	return out
}

// Shutdown closes the step sockets (the ranks then shut down on their own),
// waits for the rank processes until ctx ends, kills those still running,
// and unmaps the segment.
func (g *Group) Shutdown(ctx context.Context) error {
	g.failMu.Lock()
	g.closing = true
	g.failMu.Unlock()
	g.fail(fmt.Errorf("%w: shut down", ErrGroupFailed))
	for _, p := range g.ranks {
		select {
		case <-p.exited:
		case <-ctx.Done():
			p.cmd.Process.Kill()
			<-p.exited
		}
	}
	g.watchers.Wait()
	var err error
	if g.reducer != nil {
		err = g.reducer.Close()
	}
	if g.seg != nil {
		g.seg.Close()
	}
	return err
}
