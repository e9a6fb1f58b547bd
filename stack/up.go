package stack

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cacheblend/cacheblend/internal/freeport"
	"github.com/cacheblend/cacheblend/rpc/mtls"
)

// UpConfig configures Up. Zero values take the documented defaults.
type UpConfig struct {
	// Exe is the cb binary to run; default the current executable.
	Exe string
	// APIAddr is the engine's OpenAI API address; default 127.0.0.1:8000.
	APIAddr string
	// OTLPEndpoint, when set, is exported to every process as
	// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (with OTLPProtocol). When empty
	// the processes inherit the environment (tracing off unless it says
	// otherwise).
	OTLPEndpoint string
	// OTLPProtocol is the protocol of OTLPEndpoint; default http/protobuf.
	OTLPProtocol string
	// EngineArgs, WorkerArgs and BlendArgs are extra flags per process.
	EngineArgs, WorkerArgs, BlendArgs []string
	// ModelPath is a GGUF model file every engine and worker serves
	// (--model, made absolute); empty: the built-in model.
	ModelPath string
	// TP, above 1, runs every worker as a tensor-parallel group of TP rank
	// processes (cb worker --tp): the supervised process is rank 0, which
	// starts the others and exits when one dies, so the supervisor restarts
	// the whole group. Default 1.
	TP int
	// Env is added to every process's environment.
	Env []string
	// Supervisor configures supervision (logs, timeouts, backoff).
	Supervisor Config
	// Plaintext turns mutual TLS off: the worker's and the blend server's
	// gRPC ports then admit any local process. By default Up generates a
	// throw-away CA and one certificate per process (see TLSDir) and every
	// gRPC hop is mutual TLS with the callers' roles checked.
	Plaintext bool
	// TLSDir, when set (and not Plaintext), is a certificate directory in
	// the layout of mtls.WriteDir that Up uses instead of generating one,
	// and does not remove: stacks started with the same TLSDir share one CA,
	// so that their processes may call each other (a prefill node's worker
	// is read by a decode node's worker, docs/design.md §9).
	TLSDir string
	// TLSValidity is how long the generated certificates are valid;
	// default DefaultTLSValidity. A stack running longer must be restarted
	// (reconnections fail once they expire).
	TLSValidity time.Duration
	// Nodes is the number of nodes (engine + worker + blend server each)
	// to start on loopback, sharing one fleet tier; <= 1 is one node. With
	// more than one, a gateway (cb gateway) in front of the nodes' engines
	// listens on APIAddr and every engine on a free port (unless NoGateway:
	// then node 0's engine listens on APIAddr).
	Nodes int
	// PrefillNodes and DecodeNodes, both positive, start a disaggregated fleet instead of
	// Nodes (docs/design.md §9): PrefillNodes nodes whose engines run with --role prefill,
	// then DecodeNodes with --role decode, sharing one fleet tier and one CA (TLSDir, or one
	// generated for all of them: a decode node's worker reads the prefill node's worker over
	// mutual TLS), every engine on a free port picked up front (a restarted engine keeps its
	// URL), and a gateway on APIAddr given --prefill and --decode.
	PrefillNodes, DecodeNodes int
	// GatewayArgs are extra flags for cb gateway (e.g. --policy).
	GatewayArgs []string
	// NoGateway starts no gateway in front of a multi-node stack.
	NoGateway bool
	// RedisURL is the fleet tier every node's blend server joins
	// (--redis-url). Empty with Nodes > 1: Up starts redis-server on a free
	// loopback port with a random password (Debian package redis-server)
	// and stops it at Shutdown.
	RedisURL string
	// FleetKey authenticates the values of the fleet tier (cb blend's
	// CB_BLEND_FLEET_KEY, at least 32 bytes; every node of a fleet must
	// have the same). Empty with a redis-server Up starts itself: Up
	// generates one for the stack's nodes. Required with RedisURL set.
	FleetKey string
	// StateDir, when set, is the stack's state directory, kept across
	// restarts: every blend server keeps its L2 (chunk files and the
	// registered sequences) in it, <StateDir>/l2 (node i > 0 of a
	// multi-node stack: <StateDir>/node<i>/l2), so stored documents
	// survive a restart of the blend server and of the stack. Up creates
	// it with mode 0700 and refuses an existing one that group or others
	// may access (the chunks hold the KV of prompts). It is checked
	// without following a symbolic link (a link is refused:
	// ErrStateDirUnsafe). Empty: no L2.
	StateDir string
	// L2Bytes is the L2 budget of the blend servers (cb blend --l2-bytes),
	// with StateDir: 0 sizes it from the state directory's free space
	// (DefaultL2Budget, split between the nodes); negative leaves L2
	// unbounded. A --l2-bytes in BlendArgs comes later and wins.
	L2Bytes int64
}

// Default L2 budget under Up (DefaultL2Budget).
const (
	// DefaultL2Fraction is the share of the state directory's free space
	// the L2 budget takes.
	DefaultL2Fraction = 0.25
	// DefaultL2Cap bounds the default L2 budget: 32 GiB.
	DefaultL2Cap = 32 << 30
)

// DefaultL2Budget is the L2 budget of each of nodes blend servers whose L2
// is in dir: DefaultL2Fraction of the free space of dir's filesystem (as
// seen by an unprivileged user, statfs f_bavail), at most DefaultL2Cap,
// split evenly; at least 1 MiB.
func DefaultL2Budget(dir string, nodes int) (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("stack: free space of %s: %w", dir, err)
	}
	free := float64(st.Bavail) * float64(st.Bsize)
	b := min(int64(free*DefaultL2Fraction), DefaultL2Cap) / int64(max(nodes, 1))
	return max(b, 1<<20), nil
}

// DefaultTLSValidity is the validity of the certificates Up generates.
const DefaultTLSValidity = 7 * 24 * time.Hour

// Endpoint describes one process of a running stack, as written to the
// endpoints file.
type Endpoint struct {
	API     string `json:"api,omitempty"`
	GRPC    string `json:"grpc,omitempty"`
	Metrics string `json:"metrics,omitempty"`
	PID     int    `json:"pid,omitempty"`
	OTLP    string `json:"otlp,omitempty"`
	UI      string `json:"ui,omitempty"`
}

// Endpoints is the endpoints file: one entry per process.
type Endpoints struct {
	// Gateway is the gateway in front of a multi-node stack's engines (its
	// OpenAI API is the stack's), nil without one.
	Gateway   *Endpoint `json:"gateway,omitempty"`
	Engine    Endpoint  `json:"engine"`
	Worker    Endpoint  `json:"worker"`
	Blend     Endpoint  `json:"blend"`
	Collector *Endpoint `json:"collector,omitempty"`
	// MutualTLS reports whether the gRPC ports serve mutual TLS (callers
	// need a certificate of the stack's CA naming an allowed role).
	MutualTLS bool `json:"mutual_tls"`
	// Nodes lists every node of a multi-node stack (node 0 is also the
	// top-level engine, worker and blend).
	Nodes []NodeEndpoints `json:"nodes,omitempty"`
	// Redis is the fleet tier the nodes share.
	Redis *RedisEndpoint `json:"redis,omitempty"`
}

// NodeEndpoints are one node's processes.
type NodeEndpoints struct {
	// Role is the engine's role in a disaggregated fleet ("prefill" or "decode"), empty
	// otherwise.
	Role   string   `json:"role,omitempty"`
	Engine Endpoint `json:"engine"`
	Worker Endpoint `json:"worker"`
	Blend  Endpoint `json:"blend"`
}

// RedisEndpoint is the fleet tier of a stack; URL carries its password
// (the endpoints file is then written 0600).
type RedisEndpoint struct {
	URL string `json:"url"`
	PID int    `json:"pid,omitempty"`
}

// API returns the stack's OpenAI API: the gateway's when there is one,
// else the engine's.
func (e Endpoints) API() string {
	if e.Gateway != nil {
		return e.Gateway.API
	}
	return e.Engine.API
}

// Stack is a running blend + worker + engine, each its own OS process.
type Stack struct {
	gw       *Supervisor // the gateway of a multi-node stack, or nil
	sup      *Supervisor
	tlsDir   string      // "" when plaintext
	ownTLS   bool        // tlsDir was generated by Up (in a run directory)
	runDirs  []string    // this stack's run directories (rundir.go), removed by Shutdown
	others   []*Stack    // nodes 1.. of a multi-node stack
	redisSup *Supervisor // the fleet tier's redis-server Up started, or nil
	l2Budget int64       // the blend server's L2 budget passed (0: none or unbounded)

	// epMu guards eps, endpointsFile and head: a process restarted by a
	// supervisor updates its pid from the supervisor's goroutine.
	epMu          sync.Mutex
	eps           Endpoints
	endpointsFile string // the file WriteEndpoints wrote, rewritten on restarts
	head          *Stack // node 0 of a multi-node stack (for the others), else nil
}

// Up starts cb blend, cb worker and cb engine (in that order, each waiting
// for the previous to be ready) on loopback ports: the API on APIAddr, every
// other port chosen free. A process that dies later is restarted with the
// same ports (and certificates).
//
// Unless cfg.Plaintext, Up first generates a throw-away CA and a certificate
// per process (rpc/mtls.WriteDir: mtls.DefaultHosts and the process's role,
// valid for cfg.TLSValidity; files 0600 in a directory 0700, no CA key) and
// passes each process its --tls-cert, --tls-key and --tls-ca before cfg's
// extra flags. Shutdown removes the directory.
func Up(ctx context.Context, cfg UpConfig) (*Stack, error) {
	if (cfg.PrefillNodes > 0) != (cfg.DecodeNodes > 0) {
		return nil, errors.New("stack: a disaggregated fleet needs at least one prefill and one decode node")
	}
	if cfg.Nodes > 1 || cfg.PrefillNodes > 0 {
		return upNodes(ctx, cfg)
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if cfg.ModelPath != "" {
		abs, err := filepath.Abs(cfg.ModelPath)
		if err != nil {
			return nil, fmt.Errorf("stack: model path: %w", err)
		}
		if _, err := os.Stat(abs); err != nil {
			return nil, fmt.Errorf("stack: model file: %w", err)
		}
		cfg.ModelPath = abs
	}
	ports, err := freeport.Ports(4)
	if err != nil {
		return nil, err
	}
	blendGRPC := "127.0.0.1:" + strconv.Itoa(ports[0])
	blendMetrics := "127.0.0.1:" + strconv.Itoa(ports[1])
	workerGRPC := "127.0.0.1:" + strconv.Itoa(ports[2])
	workerMetrics := "127.0.0.1:" + strconv.Itoa(ports[3])
	env := cfg.env()
	s := &Stack{}
	s.sup = NewSupervisor(s.supervision(cfg.Supervisor))
	CleanStaleRunDirs(s.sup.cfg.Logger)
	// The blend server's KV socket, in this stack's run directory (0700,
	// removed at Shutdown, or at the next start when killed), at a path
	// that survives a restart of cb blend.
	runDir, err := makeRunDir()
	if err != nil {
		return nil, err
	}
	s.runDirs = []string{runDir}
	fail := func(err error) (*Stack, error) {
		_ = s.Shutdown(context.Background())
		return nil, err
	}
	kvDir, err := makeSubdir(runDir, "kv")
	if err != nil {
		return fail(err)
	}
	kvSocket := filepath.Join(kvDir, "blend-kv.sock")
	if !cfg.Plaintext {
		if s.tlsDir = cfg.TLSDir; s.tlsDir == "" {
			if s.tlsDir, err = makeCerts(runDir, cfg.TLSValidity); err != nil {
				return fail(err)
			}
			s.ownTLS = true
		}
		s.setEndpoint(func(e *Endpoints) { e.MutualTLS = true })
	}
	// args are a process's flags: base, its certificate's (unless plaintext), then extra.
	args := func(base []string, r mtls.Role, extra []string) []string {
		if s.tlsDir != "" {
			f := mtls.DirFiles(s.tlsDir, r)
			base = slices.Concat(base, []string{"--tls-cert", f.Cert, "--tls-key", f.Key, "--tls-ca", f.CA})
		}
		return slices.Concat(base, extra)
	}
	blendArgs := []string{"blend", "--addr", blendGRPC, "--metrics-addr", blendMetrics, "--kv-socket", kvSocket}
	if cfg.StateDir != "" {
		if err := MakeStateDir(cfg.StateDir); err != nil {
			return fail(err)
		}
		blendArgs = append(blendArgs, "--l2-dir", filepath.Join(cfg.StateDir, "l2"))
		if cfg.L2Bytes == 0 {
			if cfg.L2Bytes, err = DefaultL2Budget(cfg.StateDir, 1); err != nil {
				return fail(err)
			}
		}
		if cfg.L2Bytes > 0 {
			s.l2Budget = cfg.L2Bytes
			blendArgs = append(blendArgs, "--l2-bytes", strconv.FormatInt(cfg.L2Bytes, 10))
		}
	}
	blendEnv := env
	if cfg.RedisURL != "" && cfg.FleetKey == "" {
		return fail(errors.New("stack: a fleet tier (RedisURL) needs the fleet's key (FleetKey; cb up --fleet-key-file or CB_UP_FLEET_KEY)"))
	}
	if cfg.RedisURL != "" {
		// In the environment (readable by this user only), not in the
		// command line (readable by every user): the URL holds the password.
		blendEnv = append(slices.Clip(env), "CB_BLEND_REDIS_URL="+cfg.RedisURL, "CB_BLEND_FLEET_KEY="+cfg.FleetKey)
	}
	r, err := s.sup.Start(ctx, Spec{Name: "cb-blend", Path: cfg.Exe, Env: blendEnv,
		Args: args(blendArgs, mtls.Blend, cfg.BlendArgs)})
	if err != nil {
		return fail(err)
	}
	s.setEndpoint(func(e *Endpoints) { e.Blend = endpointOf(r) })
	r, err = s.sup.Start(ctx, Spec{Name: "cb-worker", Path: cfg.Exe, Env: env,
		Args: args(append([]string{"worker", "--addr", workerGRPC, "--metrics-addr", workerMetrics, "--blend", blendGRPC, "--blend-kv-socket", kvSocket}, modelArgs(cfg)...), mtls.Worker, tpArgs(cfg))})
	if err != nil {
		return fail(err)
	}
	s.setEndpoint(func(e *Endpoints) { e.Worker = endpointOf(r) })
	r, err = s.sup.Start(ctx, Spec{Name: "cb-engine", Path: cfg.Exe, Env: env,
		Args: args(append([]string{"engine", "--addr", cfg.APIAddr, "--worker", workerGRPC, "--blend", blendGRPC}, modelArgs(cfg)...), mtls.Engine, cfg.EngineArgs)})
	if err != nil {
		return fail(err)
	}
	s.setEndpoint(func(e *Endpoints) { e.Engine = endpointOf(r) })
	// Ready means serving: the engine's /health answers 200 once its worker
	// has answered.
	if err := WaitHealthy(ctx, r.Values["api"]+"/health", s.sup.cfg.ReadyTimeout); err != nil {
		return fail(err)
	}
	return s, nil
}

// WaitHealthy polls url until it answers 200, ctx ends or timeout passes.
func WaitHealthy(ctx context.Context, url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	client := &http.Client{Timeout: 2 * time.Second}
	last := "no answer"
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return fmt.Errorf("stack: health check: %w", err)
		}
		resp, err := client.Do(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: %s not healthy after %s (%s)", ErrNotReady, url, timeout, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Endpoints returns the stack's endpoints, with the current PIDs (a
// restarted process's new one).
func (s *Stack) Endpoints() Endpoints {
	s.epMu.Lock()
	defer s.epMu.Unlock()
	return s.eps.clone()
}

// clone is a deep copy of e: the stack keeps updating its own (a restarted
// process's pid, the node list) while callers read theirs.
func (e Endpoints) clone() Endpoints {
	c := e
	if e.Gateway != nil {
		g := *e.Gateway
		c.Gateway = &g
	}
	if e.Collector != nil {
		col := *e.Collector
		c.Collector = &col
	}
	if e.Redis != nil {
		r := *e.Redis
		c.Redis = &r
	}
	c.Nodes = slices.Clone(e.Nodes)
	return c
}

// SetCollector records the trace collector's endpoints in the endpoints
// file.
func (s *Stack) SetCollector(otlp, ui string) {
	s.setEndpoint(func(e *Endpoints) { e.Collector = &Endpoint{OTLP: otlp, UI: ui} })
}

// SetCollectorMetrics records the trace collector's own /metrics URL in the
// endpoints file (its "metrics"), after SetCollector.
func (s *Stack) SetCollectorMetrics(url string) {
	s.setEndpoint(func(e *Endpoints) {
		if e.Collector != nil {
			e.Collector.Metrics = url
		}
	})
}

// L2Budget is the L2 budget in bytes given to each blend server (the
// default sized from the state directory's free space, or UpConfig.L2Bytes);
// 0 without a state directory or when unbounded.
func (s *Stack) L2Budget() int64 { return s.l2Budget }

// Supervisor gives access to the processes (status, signals).
func (s *Stack) Supervisor() *Supervisor { return s.sup }

// WriteEndpoints writes the endpoints file atomically (JSON, mode 0644;
// 0600 when it holds the Redis URL and its password). From then on the
// file is rewritten whenever a supervised process is restarted (its new
// pid), until Shutdown.
func (s *Stack) WriteEndpoints(path string) error {
	s.epMu.Lock()
	defer s.epMu.Unlock()
	s.endpointsFile = path
	return s.writeEndpointsLocked()
}

// writeEndpointsLocked writes s.eps to s.endpointsFile (callers hold epMu).
func (s *Stack) writeEndpointsLocked() error {
	b, err := json.MarshalIndent(s.eps, "", "  ")
	if err != nil {
		return fmt.Errorf("stack: endpoints file: %w", err)
	}
	mode := os.FileMode(0o644)
	if s.eps.Redis != nil {
		mode = 0o600 // the Redis URL carries its password
	}
	return WriteFileAtomic(s.endpointsFile, append(b, '\n'), mode)
}

// WriteFileAtomic writes data to path with mode: into a temporary file next to path,
// renamed over it, so a reader sees the old file or the new one, never a part.
func WriteFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("stack: write %s: %w", path, err)
	}
	_, werr := tmp.Write(data)
	if err := errors.Join(werr, tmp.Chmod(mode), tmp.Close()); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("stack: write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("stack: write %s: %w", path, err)
	}
	return nil
}

// TLSDir is the directory of the stack's CA certificate and per-process
// certificates and keys (rpc/mtls.DirFiles names them), "" when the stack
// is plaintext. It exists until Shutdown.
func (s *Stack) TLSDir() string { return s.tlsDir }

// Shutdown stops engine, worker and blend (in that order), then removes
// the KV socket's directory and the certificates; in a multi-node stack it
// stops the gateway first, then the other nodes, then the Redis server Up
// started.
func (s *Stack) Shutdown(ctx context.Context) error {
	s.epMu.Lock()
	s.endpointsFile = "" // no rewrite while the processes stop
	s.epMu.Unlock()
	var errs []error
	if s.gw != nil {
		errs = append(errs, s.gw.Shutdown(ctx))
	}
	for _, o := range s.others {
		errs = append(errs, o.Shutdown(ctx))
	}
	err := errors.Join(append(errs, s.sup.Shutdown(ctx))...)
	if s.redisSup != nil {
		err = errors.Join(err, s.redisSup.Shutdown(ctx))
	}
	for _, d := range s.runDirs { // the KV sockets, the certificates, the Redis configuration
		if rerr := os.RemoveAll(d); rerr != nil && err == nil {
			err = fmt.Errorf("stack: remove the run directory: %w", rerr)
		}
	}
	return err
}

// makeCerts writes a throw-away CA's certificate and one certificate per
// process, valid for validity (DefaultTLSValidity when <= 0), into
// runDir/tls (mode 0700) and returns it.
func makeCerts(runDir string, validity time.Duration) (string, error) {
	if validity <= 0 {
		validity = DefaultTLSValidity
	}
	dir, err := makeSubdir(runDir, "tls")
	if err != nil {
		return "", fmt.Errorf("stack: certificates: %w", err)
	}
	if err := mtls.WriteDir(dir, mtls.DefaultHosts, validity); err != nil {
		return "", fmt.Errorf("stack: certificates: %w", err)
	}
	return dir, nil
}

// upNodes starts cfg.Nodes single-node stacks sharing one fleet tier (the
// Redis server at cfg.RedisURL, or one it starts) and, unless NoGateway, a
// gateway on cfg.APIAddr in front of their engines; it returns node 0
// holding the others and the gateway.
func upNodes(ctx context.Context, cfg UpConfig) (*Stack, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	// The nodes' roles: "" for every node of Nodes, else prefill then decode.
	roles := make([]string, cfg.Nodes)
	if cfg.PrefillNodes > 0 {
		roles = slices.Concat(slices.Repeat([]string{"prefill"}, cfg.PrefillNodes), slices.Repeat([]string{"decode"}, cfg.DecodeNodes))
	}
	// The shared run directory: one CA for all the nodes (their workers may call each
	// other) and the Redis server's configuration, removed with the stack.
	CleanStaleRunDirs(NewSupervisor(cfg.Supervisor).cfg.Logger)
	runDir, err := makeRunDir()
	if err != nil {
		return nil, err
	}
	tlsDir, ownTLS := cfg.TLSDir, false
	var redisSup *Supervisor
	var head atomic.Pointer[Stack] // node 0, once started
	var nodes []*Stack
	fail := func(err error) (*Stack, error) {
		for _, n := range nodes {
			_ = n.Shutdown(context.Background())
		}
		if redisSup != nil {
			_ = redisSup.Shutdown(context.Background())
		}
		os.RemoveAll(runDir)
		return nil, err
	}
	if !cfg.Plaintext && tlsDir == "" {
		if tlsDir, err = makeCerts(runDir, cfg.TLSValidity); err != nil {
			return fail(err)
		}
		ownTLS = true
	}
	url := cfg.RedisURL
	var redisPID int
	if url == "" {
		spec, u, err := redisSpec(runDir)
		if err != nil {
			return fail(fmt.Errorf("stack: fleet tier for %d nodes: %w", len(roles), err))
		}
		// A restarted redis-server's pid goes to the endpoints file once node 0 exists.
		rcfg, user := cfg.Supervisor, cfg.Supervisor.OnReady
		rcfg.OnReady = func(r Ready) {
			if h := head.Load(); h != nil {
				h.onReady(r)
			}
			if user != nil {
				user(r)
			}
		}
		redisSup = NewSupervisor(rcfg)
		r, err := redisSup.Start(ctx, spec)
		if err != nil {
			return fail(fmt.Errorf("stack: fleet tier for %d nodes: %w", len(roles), err))
		}
		url, redisPID = u, r.PID
		if cfg.FleetKey == "" { // a fleet of this stack only: its own key
			key := make([]byte, 32)
			if _, err := rand.Read(key); err != nil {
				return fail(fmt.Errorf("stack: fleet key: %w", err))
			}
			cfg.FleetKey = hex.EncodeToString(key)
		}
	}
	if cfg.FleetKey == "" {
		return fail(errors.New("stack: joining the fleet tier at the Redis URL given needs the fleet's key (cb up --fleet-key-file FILE or CB_UP_FLEET_KEY; every node of the fleet has the same)"))
	}
	if cfg.StateDir != "" && cfg.L2Bytes == 0 {
		if err := MakeStateDir(cfg.StateDir); err != nil {
			return fail(err)
		}
		if cfg.L2Bytes, err = DefaultL2Budget(cfg.StateDir, len(roles)); err != nil {
			return fail(err)
		}
	}
	// Prefill/decode: one stack key for the engines and the gateway, in their environment
	// (CB_STACK_KEY, never in argv), and the engines' addresses picked up front so that each
	// prefill engine gets the decode engines as its allow-list (--decode-engine).
	pdAddrs, err := pdSetup(&cfg, roles)
	if err != nil {
		return fail(err)
	}
	for i, role := range roles {
		nc := cfg
		nc.Nodes, nc.PrefillNodes, nc.DecodeNodes, nc.RedisURL, nc.TLSDir = 0, 0, 0, url, tlsDir
		if cfg.StateDir != "" && i > 0 {
			nc.StateDir = filepath.Join(cfg.StateDir, "node"+strconv.Itoa(i))
		}
		if role != "" {
			nc.EngineArgs = append(slices.Clip(cfg.EngineArgs), "--role", role)
		}
		if role == "prefill" {
			for j, r := range roles {
				if r == "decode" {
					nc.EngineArgs = append(nc.EngineArgs, "--decode-engine", "http://"+pdAddrs[j])
				}
			}
		}
		if pdAddrs != nil {
			nc.APIAddr = pdAddrs[i]
		} else if i > 0 || !cfg.NoGateway {
			// A port of its own, kept when the engine is restarted (the gateway
			// has its URL).
			ports, err := freeport.Ports(1)
			if err != nil {
				return fail(err)
			}
			nc.APIAddr = "127.0.0.1:" + strconv.Itoa(ports[0])
		}
		n, err := Up(ctx, nc)
		if err != nil {
			return fail(fmt.Errorf("stack: node %d %s: %w", i, role, err))
		}
		nodes = append(nodes, n)
	}
	s := nodes[0]
	s.epMu.Lock() // refreshNodes reads others from supervisor goroutines
	s.others = nodes[1:]
	s.epMu.Unlock()
	s.ownTLS = ownTLS
	s.runDirs = append(s.runDirs, runDir) // the head removes the shared run directory after the other nodes stopped
	s.redisSup = redisSup
	head.Store(s)
	for _, n := range nodes[1:] {
		n.epMu.Lock()
		n.head = s
		n.epMu.Unlock()
	}
	s.setEndpoint(func(e *Endpoints) {
		e.Redis = &RedisEndpoint{URL: url, PID: redisPID}
		for i := range nodes {
			e.Nodes = append(e.Nodes, NodeEndpoints{Role: roles[i]})
		}
	})
	s.refreshNodes()
	if cfg.NoGateway {
		return s, nil
	}
	if err := s.startGateway(ctx, cfg); err != nil {
		_ = s.Shutdown(context.Background())
		return nil, fmt.Errorf("stack: gateway: %w", err)
	}
	return s, nil
}

// pdSetup prepares a disaggregated fleet (roles not ""): it adds a random stack key to
// cfg.Env (unless cfg.Env has CB_STACK_KEY already) and returns every engine's address, each a
// free port of its own (node 0's is cfg.APIAddr under NoGateway); nil, nil without roles.
func pdSetup(cfg *UpConfig, roles []string) ([]string, error) {
	if len(roles) == 0 || roles[0] == "" {
		return nil, nil
	}
	if !slices.ContainsFunc(cfg.Env, func(e string) bool { return strings.HasPrefix(e, "CB_STACK_KEY=") }) {
		key := make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, fmt.Errorf("stack: stack key: %w", err)
		}
		cfg.Env = append(slices.Clip(cfg.Env), "CB_STACK_KEY="+hex.EncodeToString(key))
	}
	ports, err := freeport.Ports(len(roles))
	if err != nil {
		return nil, err
	}
	addrs := make([]string, len(roles))
	for i, p := range ports {
		addrs[i] = "127.0.0.1:" + strconv.Itoa(p)
	}
	if cfg.NoGateway {
		addrs[0] = cfg.APIAddr
	}
	return addrs, nil
}

// startGateway starts cb gateway on cfg.APIAddr in front of the nodes'
// engines and waits until it is healthy.
func (s *Stack) startGateway(ctx context.Context, cfg UpConfig) error {
	args := append([]string{"gateway", "--addr", cfg.APIAddr}, modelArgs(cfg)...)
	for _, n := range s.Endpoints().Nodes {
		flag := "--engine"
		if n.Role != "" {
			flag = "--" + n.Role // --prefill or --decode
		}
		args = append(args, flag, n.Engine.API)
	}
	s.gw = NewSupervisor(s.supervision(cfg.Supervisor))
	r, err := s.gw.Start(ctx, Spec{Name: "cb-gateway", Path: cfg.Exe, Env: cfg.env(), Args: append(args, cfg.GatewayArgs...)})
	if err != nil {
		return err
	}
	gw := endpointOf(r)
	s.setEndpoint(func(e *Endpoints) { e.Gateway = &gw })
	return WaitHealthy(ctx, r.Values["api"]+"/health", s.gw.cfg.ReadyTimeout)
}

// withDefaults returns c with the default Exe (the current executable), APIAddr and
// OTLPProtocol.
func (c UpConfig) withDefaults() (UpConfig, error) {
	if c.Exe == "" {
		exe, err := os.Executable()
		if err != nil {
			return c, fmt.Errorf("stack: find cb binary: %w", err)
		}
		c.Exe = exe
	}
	c.APIAddr = cmp.Or(c.APIAddr, "127.0.0.1:8000")
	c.OTLPProtocol = cmp.Or(c.OTLPProtocol, "http/protobuf")
	return c, nil
}

// env is the environment added to every process: Env, and the OTLP exporter's variables
// when OTLPEndpoint is set.
func (c UpConfig) env() []string {
	env := slices.Clone(c.Env)
	if c.OTLPEndpoint != "" {
		env = append(env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="+c.OTLPEndpoint, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="+c.OTLPProtocol)
	}
	return env
}

// endpointOf is the endpoint a process announced when it became ready.
func endpointOf(r Ready) Endpoint {
	return Endpoint{API: r.Values["api"], GRPC: r.Values["grpc"], Metrics: r.Values["metrics"], PID: r.PID}
}

// modelArgs is --model for an engine or a worker when cfg names a model
// file.
func modelArgs(cfg UpConfig) []string {
	if cfg.ModelPath == "" {
		return nil
	}
	return []string{"--model", cfg.ModelPath}
}

// tpArgs is cfg.WorkerArgs with --tp when cfg.TP is above 1.
func tpArgs(cfg UpConfig) []string {
	if cfg.TP <= 1 {
		return cfg.WorkerArgs
	}
	return append(slices.Clone(cfg.WorkerArgs), "--tp="+strconv.Itoa(cfg.TP))
}
