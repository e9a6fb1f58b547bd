package stack

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Defaults of Config.
const (
	DefaultReadyTimeout = 60 * time.Second
	DefaultStopTimeout  = 10 * time.Second
	DefaultMinBackoff   = 500 * time.Millisecond
	DefaultMaxBackoff   = 15 * time.Second
)

// ErrNotReady reports a process that exited or timed out before it
// announced itself ready.
var ErrNotReady = errors.New("stack: process not ready")

// Spec describes one supervised process.
type Spec struct {
	// Name is the service name (cb-blend, cb-worker, cb-engine); it prefixes
	// the process's log lines.
	Name string
	// Path is the executable; Args its arguments (without argv[0]).
	Path string
	Args []string
	// Env is added to the supervisor's environment.
	Env []string
	// Probe, when set, replaces the READY line for a process that prints
	// none (redis-server): the process is ready once Probe returns nil,
	// polled every 50 ms while it runs (each call bounded by its ctx, 2 s);
	// its Ready then has Service Name and no values.
	Probe func(ctx context.Context) error
}

// Ready is what a process announced on stdout when ready: a line
// "READY <service> key=value ...".
type Ready struct {
	Service string
	Values  map[string]string
	PID     int
}

// Config configures a Supervisor; zero values take the defaults above.
type Config struct {
	ReadyTimeout time.Duration
	StopTimeout  time.Duration
	MinBackoff   time.Duration
	MaxBackoff   time.Duration
	// Logs receives every child log line prefixed with its service name;
	// default os.Stderr. Writes are serialized.
	Logs io.Writer
	// Logger reports supervision events (start, exit, restart); default
	// writes to Logs.
	Logger *slog.Logger
	// OnReady is called (from a supervisor goroutine) every time a process
	// becomes ready, including after a restart.
	OnReady func(Ready)
}

// Supervisor runs a set of processes. Start them in dependency order with
// Start; Shutdown stops them in reverse order. Safe for concurrent use.
type Supervisor struct {
	cfg Config

	logMu sync.Mutex

	mu       sync.Mutex
	procs    []*proc
	stopping bool
	wg       sync.WaitGroup
}

type proc struct {
	spec     Spec
	mu       sync.Mutex
	cmd      *exec.Cmd
	ready    *Ready
	restarts int
	exited   chan struct{} // closed when the current cmd exits
	stop     chan struct{}
	stopOnce sync.Once
}

// NewSupervisor returns a Supervisor with cfg's settings.
func NewSupervisor(cfg Config) *Supervisor {
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = DefaultReadyTimeout
	}
	if cfg.StopTimeout <= 0 {
		cfg.StopTimeout = DefaultStopTimeout
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = DefaultMinBackoff
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = DefaultMaxBackoff
	}
	if cfg.Logs == nil {
		cfg.Logs = os.Stderr
	}
	s := &Supervisor{cfg: cfg}
	if cfg.Logger == nil {
		s.cfg.Logger = slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
			s.writeLine("cb-up", strings.TrimRight(string(p), "\n"))
			return len(p), nil
		}), nil))
	}
	return s
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func (s *Supervisor) writeLine(name, line string) {
	s.logMu.Lock()
	defer s.logMu.Unlock()
	fmt.Fprintf(s.cfg.Logs, "%-10s| %s\n", name, line)
}

// Start launches spec and waits until it announces READY (or ctx ends, the
// process exits, or ReadyTimeout passes). From then on the process is
// restarted with backoff whenever it dies, until Shutdown.
func (s *Supervisor) Start(ctx context.Context, spec Spec) (Ready, error) {
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		return Ready{}, errors.New("stack: supervisor is shutting down")
	}
	p := &proc{spec: spec, stop: make(chan struct{})}
	s.procs = append(s.procs, p)
	s.mu.Unlock()
	readyCh := make(chan Ready, 1)
	exited, err := s.launch(p, readyCh)
	if err != nil {
		return Ready{}, err
	}
	t := time.NewTimer(s.cfg.ReadyTimeout)
	defer t.Stop()
	select {
	case r := <-readyCh:
		s.wg.Go(func() { s.watch(p, exited) })
		return r, nil
	case <-exited:
		return Ready{}, fmt.Errorf("%w: %s exited before it was ready (%s)", ErrNotReady, spec.Name, p.exitReason())
	case <-t.C:
		return Ready{}, fmt.Errorf("%w: %s not ready after %s", ErrNotReady, spec.Name, s.cfg.ReadyTimeout)
	case <-ctx.Done():
		return Ready{}, ctx.Err()
	}
}

// launch starts the process once and streams its output; the channel it returns is closed
// when the process exits.
func (s *Supervisor) launch(p *proc, readyCh chan<- Ready) (<-chan struct{}, error) {
	cmd := exec.Command(p.spec.Path, p.spec.Args...)
	cmd.Env = append(os.Environ(), p.spec.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("stack: %s stdout: %w", p.spec.Name, err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, fmt.Errorf("stack: %s stderr: %w", p.spec.Name, err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("stack: start %s: %w", p.spec.Name, err)
	}
	exited := make(chan struct{})
	p.mu.Lock()
	p.cmd, p.exited, p.ready = cmd, exited, nil
	p.mu.Unlock()
	s.cfg.Logger.Info("started", "service", p.spec.Name, "pid", cmd.Process.Pid)
	// stream writes r's lines to the logs (after passing each to onLine) and drains the rest.
	stream := func(r io.Reader, onLine func(string)) {
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			onLine(sc.Text())
			s.writeLine(p.spec.Name, sc.Text())
		}
		io.Copy(io.Discard, r)
	}
	var pipes sync.WaitGroup
	pipes.Go(func() {
		stream(stdout, func(line string) {
			r, ok := parseReady(line)
			if !ok {
				return
			}
			r.PID = cmd.Process.Pid
			p.mu.Lock()
			p.ready = &r
			p.mu.Unlock()
			if readyCh != nil {
				readyCh <- r
				readyCh = nil
			}
			if s.cfg.OnReady != nil {
				s.cfg.OnReady(r)
			}
		})
	})
	pipes.Go(func() { stream(stderr, func(string) {}) })
	go func() {
		pipes.Wait()
		_ = cmd.Wait()
		close(exited)
	}()
	if p.spec.Probe != nil {
		s.wg.Go(func() { s.probe(p, cmd.Process.Pid, exited, readyCh) })
	}
	return exited, nil
}

// probe polls p's Probe until it passes (then p is ready, as if it had
// printed READY) or the process exits.
func (s *Supervisor) probe(p *proc, pid int, exited <-chan struct{}, readyCh chan<- Ready) {
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := p.spec.Probe(ctx)
		cancel()
		if err == nil {
			r := Ready{Service: p.spec.Name, Values: map[string]string{}, PID: pid}
			p.mu.Lock()
			p.ready = &r
			p.mu.Unlock()
			if readyCh != nil {
				readyCh <- r
			}
			if s.cfg.OnReady != nil {
				s.cfg.OnReady(r)
			}
			return
		}
		select {
		case <-exited:
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func parseReady(line string) (Ready, bool) {
	f := strings.Fields(line)
	if len(f) < 2 || f[0] != "READY" {
		return Ready{}, false
	}
	r := Ready{Service: f[1], Values: map[string]string{}}
	for _, kv := range f[2:] {
		if k, v, ok := strings.Cut(kv, "="); ok {
			r.Values[k] = v
		}
	}
	return r, true
}

func (p *proc) exitReason() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.ProcessState == nil {
		return "unknown"
	}
	return p.cmd.ProcessState.String()
}

// watch restarts p whenever it exits (exited: its current process's), with exponential
// backoff, until stop.
func (s *Supervisor) watch(p *proc, exited <-chan struct{}) {
	// closed makes the loop wait again after a failed restart: it retries after backoff.
	closed := make(chan struct{})
	close(closed)
	backoff := s.cfg.MinBackoff
	for {
		startedAt := time.Now()
		select {
		case <-p.stop:
			return
		case <-exited:
		}
		select {
		case <-p.stop:
			return
		default:
		}
		if time.Since(startedAt) > 30*time.Second {
			backoff = s.cfg.MinBackoff
		}
		s.cfg.Logger.Error("process died; restarting", "service", p.spec.Name, "reason", p.exitReason(), "backoff", backoff.String())
		select {
		case <-p.stop:
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, s.cfg.MaxBackoff)
		p.mu.Lock()
		p.restarts++
		p.mu.Unlock()
		var err error
		if exited, err = s.launch(p, nil); err != nil {
			s.cfg.Logger.Error("restart failed", "service", p.spec.Name, "err", err)
			exited = closed
		}
	}
}

// Status describes one supervised process.
type Status struct {
	Name     string
	PID      int
	Ready    bool
	Restarts int
}

// Status reports every supervised process.
func (s *Supervisor) Status() []Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Status, 0, len(s.procs))
	for _, p := range s.procs {
		p.mu.Lock()
		st := Status{Name: p.spec.Name, Restarts: p.restarts, Ready: p.ready != nil}
		if p.cmd != nil && p.cmd.Process != nil {
			st.PID = p.cmd.Process.Pid
		}
		p.mu.Unlock()
		out = append(out, st)
	}
	return out
}

// Signal sends sig to the named process (tests use it to kill one).
func (s *Supervisor) Signal(name string, sig syscall.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.procs {
		if p.spec.Name == name {
			p.mu.Lock()
			defer p.mu.Unlock()
			if p.cmd == nil || p.cmd.Process == nil {
				return fmt.Errorf("stack: %s not running", name)
			}
			return p.cmd.Process.Signal(sig)
		}
	}
	return fmt.Errorf("stack: no process %s", name)
}

// Shutdown stops every process in reverse start order: SIGTERM, then
// SIGKILL after StopTimeout (or when ctx ends).
func (s *Supervisor) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.stopping = true
	procs := append([]*proc(nil), s.procs...)
	s.mu.Unlock()
	var errs []error
	for _, p := range slices.Backward(procs) {
		p.stopOnce.Do(func() { close(p.stop) })
		p.mu.Lock()
		cmd, exited := p.cmd, p.exited
		p.mu.Unlock()
		if cmd == nil || cmd.Process == nil {
			continue
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		t := time.NewTimer(s.cfg.StopTimeout)
		select {
		case <-exited:
		case <-t.C:
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
			errs = append(errs, fmt.Errorf("stack: %s killed after %s", p.spec.Name, s.cfg.StopTimeout))
		case <-ctx.Done():
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
			errs = append(errs, fmt.Errorf("stack: %s killed: %w", p.spec.Name, ctx.Err()))
		}
		t.Stop()
		s.cfg.Logger.Info("stopped", "service", p.spec.Name)
	}
	s.wg.Wait()
	return errors.Join(errs...)
}
