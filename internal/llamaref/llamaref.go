package llamaref

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// ErrNotInstalled is returned when the reference directory, node-llama-cpp or llama.cpp's source
// checkout is missing; `bash scripts/deps.sh` installs them.
var ErrNotInstalled = errors.New("llamaref: reference implementation not installed (run bash scripts/deps.sh)")

// ErrNoNode is returned by Start when no `node` executable is on PATH.
var ErrNoNode = errors.New("llamaref: node not found on PATH (install Node.js 20+, then run bash scripts/deps.sh)")

// ErrClosed is returned by calls on a *Ref that was closed or whose child process exited.
var ErrClosed = errors.New("llamaref: reference process is not running")

// ErrInvalidUTF8 is returned when a text argument is not valid UTF-8 (it could not reach
// llama.cpp unchanged).
var ErrInvalidUTF8 = errors.New("llamaref: text is not valid UTF-8")

// RefError is an error reported by the reference process for one request (bad model path,
// out-of-range token id, llama.cpp failure, ...).
type RefError struct {
	Op  string // the request's operation, e.g. "tokenize"
	Msg string // the message from the node side
}

func (e *RefError) Error() string { return "llamaref: " + e.Op + ": " + e.Msg }

// Dir returns the reference directory: $CB_REF_DIR, or $XDG_CACHE_HOME/cacheblend/ref, or
// ~/.cache/cacheblend/ref (the same rule as scripts/deps.sh).
func Dir() string {
	if d := os.Getenv("CB_REF_DIR"); d != "" {
		return d
	}
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			home = "."
		}
		cache = filepath.Join(home, ".cache")
	}
	return filepath.Join(cache, "cacheblend", "ref")
}

// LlamaCppSource returns Dir()/llama.cpp, llama.cpp's source checkout (models/ggml-vocab-*.gguf
// with their .inp/.out test vectors, models/templates, src/). The error wraps ErrNotInstalled
// when it is missing.
func LlamaCppSource() (string, error) {
	d := filepath.Join(Dir(), "llama.cpp")
	if st, err := os.Stat(filepath.Join(d, "models")); err != nil || !st.IsDir() {
		return "", fmt.Errorf("llama.cpp source %s: %w", d, ErrNotInstalled)
	}
	return d, nil
}

// ScriptPath returns the absolute path of scripts/ref/llama.mjs in this source tree (located from
// this package's source file, not from the working directory).
func ScriptPath() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("llamaref: cannot locate package source")
	}
	p := filepath.Join(filepath.Dir(file), "..", "..", "scripts", "ref", "llama.mjs")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("llamaref: driver script: %w", err)
	}
	return p, nil
}

// Ref is one running reference process. It is safe for concurrent use; requests are served one
// at a time, in order. Close it when done.
type Ref struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	resp  *os.File
	wmu   sync.Mutex // serialises writes to stdin

	mu      sync.Mutex
	nextID  int64
	pending map[int64]chan []byte
	dead    error // set once the response stream ended

	exited chan struct{} // closed when the process was reaped
	stderr *tailBuffer
	closed sync.Once
}

// startTimeout bounds how long Start waits for the child's ready line when ctx has no deadline.
const startTimeout = 2 * time.Minute

// Start launches `node scripts/ref/llama.mjs`. ctx bounds the start-up only (default 2 minutes);
// the process lives until Close. Errors wrap ErrNoNode or ErrNotInstalled when something is
// missing (tests must fail on them, not skip).
func Start(ctx context.Context) (*Ref, error) { return StartWith(ctx, StartOptions{}) }

// StartOptions are the optional settings of StartWith; the zero value is Start's.
type StartOptions struct {
	// CPUVariant, when set, is the only llama.cpp CPU backend the child can load: one of the
	// prebuilt variants node-llama-cpp ships (libggml-cpu-<variant>.so: x64, sse42, sandybridge,
	// haswell, skylakex, icelake, alderlake, zen4, …). ggml otherwise loads the best variant this
	// CPU runs; "haswell" (AVX2, FMA, F16C) measures what a CPU without AVX-512 gets. The
	// variant's tree is Dir()/cpu-<variant>: node_modules hard-linked from Dir()'s without the
	// other variants, made on first use.
	CPUVariant string
}

// StartWith is Start with options.
func StartWith(ctx context.Context, o StartOptions) (*Ref, error) {
	node, err := exec.LookPath("node")
	if err != nil {
		return nil, ErrNoNode
	}
	dir := Dir()
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "node-llama-cpp", "dist", "index.js")); err != nil {
		return nil, fmt.Errorf("node-llama-cpp in %s: %w", dir, ErrNotInstalled)
	}
	if o.CPUVariant != "" {
		if dir, err = variantTree(dir, o.CPUVariant); err != nil {
			return nil, err
		}
	}
	script, err := ScriptPath()
	if err != nil {
		return nil, err
	}
	respR, respW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("llamaref: pipe: %w", err)
	}
	cmd := exec.Command(node, script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CB_REF_DIR="+dir)
	cmd.ExtraFiles = []*os.File{respW} // fd 3 in the child
	tail := &tailBuffer{max: 64 << 10, echo: os.Getenv("CB_REF_VERBOSE") != ""}
	cmd.Stderr = tail
	cmd.Stdout = tail
	setProcAttr(cmd)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		respR.Close()
		respW.Close()
		return nil, fmt.Errorf("llamaref: stdin pipe: %w", err)
	}
	if err := cmd.Start(); err != nil {
		respR.Close()
		respW.Close()
		return nil, fmt.Errorf("llamaref: start node: %w", err)
	}
	respW.Close()
	r := &Ref{cmd: cmd, stdin: stdin, resp: respR, pending: map[int64]chan []byte{}, exited: make(chan struct{}), stderr: tail}
	ready := make(chan []byte, 1)
	r.pending[0] = ready
	r.nextID = 1
	go r.readLoop()
	go func() {
		_ = cmd.Wait()
		close(r.exited)
	}()

	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, startTimeout)
		defer cancel()
	}
	select {
	case line, ok := <-ready:
		var h header
		if ok {
			if err := json.Unmarshal(line, &h); err != nil || !h.OK {
				ok = false
			}
		}
		if !ok {
			r.Close()
			return nil, fmt.Errorf("llamaref: node driver failed to start: %w\n%s", ErrClosed, r.stderr.String())
		}
	case <-ctx.Done():
		r.Close()
		return nil, fmt.Errorf("llamaref: waiting for node driver: %w\n%s", ctx.Err(), r.stderr.String())
	}
	return r, nil
}

type header struct {
	ID    int64  `json:"id"`
	OK    bool   `json:"ok"`
	Error string `json:"error"`
}

func (r *Ref) readLoop() {
	br := bufio.NewReaderSize(r.resp, 1<<20)
	var err error
	for {
		var line []byte
		line, err = br.ReadBytes('\n')
		if len(line) > 0 && line[len(line)-1] == '\n' {
			var h header
			if jerr := json.Unmarshal(line, &h); jerr != nil {
				err = fmt.Errorf("llamaref: bad response line: %w", jerr)
				break
			}
			r.mu.Lock()
			ch := r.pending[h.ID]
			delete(r.pending, h.ID)
			r.mu.Unlock()
			if ch != nil {
				ch <- line
			}
		}
		if err != nil {
			break
		}
	}
	r.resp.Close()
	r.mu.Lock()
	if err == io.EOF {
		err = ErrClosed
	}
	r.dead = err
	for id, ch := range r.pending {
		close(ch)
		delete(r.pending, id)
	}
	r.mu.Unlock()
}

// call sends one request and decodes the response into out (which may be nil).
func (r *Ref) call(op string, req map[string]any, out any) error {
	r.mu.Lock()
	if r.dead != nil {
		r.mu.Unlock()
		return fmt.Errorf("llamaref: %s: %w", op, ErrClosed)
	}
	id := r.nextID
	r.nextID++
	ch := make(chan []byte, 1)
	r.pending[id] = ch
	r.mu.Unlock()

	req["id"] = id
	req["op"] = op
	b, err := json.Marshal(req)
	if err != nil {
		r.forget(id)
		return fmt.Errorf("llamaref: %s: encode request: %w", op, err)
	}
	b = append(b, '\n')
	r.wmu.Lock()
	_, err = r.stdin.Write(b)
	r.wmu.Unlock()
	if err != nil {
		r.forget(id)
		return fmt.Errorf("llamaref: %s: write request: %w (%w)", op, err, ErrClosed)
	}
	line, ok := <-ch
	if !ok {
		return fmt.Errorf("llamaref: %s: %w\n%s", op, ErrClosed, r.stderr.String())
	}
	var h header
	if err := json.Unmarshal(line, &h); err != nil {
		return fmt.Errorf("llamaref: %s: decode response: %w", op, err)
	}
	if !h.OK {
		return &RefError{Op: op, Msg: h.Error}
	}
	if out != nil {
		if err := json.Unmarshal(line, out); err != nil {
			return fmt.Errorf("llamaref: %s: decode response: %w", op, err)
		}
	}
	return nil
}

func (r *Ref) forget(id int64) {
	r.mu.Lock()
	delete(r.pending, id)
	r.mu.Unlock()
}

// Close stops the child: it closes its stdin, waits up to 5 s for it to exit, then kills it.
// Pending and later calls fail with ErrClosed. Close is idempotent.
func (r *Ref) Close() error {
	r.closed.Do(func() {
		_ = r.stdin.Close()
		select {
		case <-r.exited:
		case <-time.After(5 * time.Second):
			_ = r.cmd.Process.Kill()
			<-r.exited
		}
	})
	return nil
}

// Stderr returns the last 64 KiB the child wrote to stderr/stdout (llama.cpp errors, node
// warnings), for diagnostics.
func (r *Ref) Stderr() string { return r.stderr.String() }

func absModel(model string) (string, error) {
	if model == "" {
		return "", errors.New("llamaref: model path is empty")
	}
	return filepath.Abs(model)
}

// Tokenize returns llama_tokenize(vocab, text, addSpecial, parseSpecial) for the GGUF file model
// (loaded vocabulary-only unless the weights are already loaded).
func (r *Ref) Tokenize(model, text string, addSpecial, parseSpecial bool) ([]int32, error) {
	out, err := r.TokenizeBatch(model, []string{text}, addSpecial, parseSpecial)
	if err != nil {
		return nil, err
	}
	return out[0], nil
}

// TokenizeBatch tokenizes many texts in one round trip, as Tokenize does each.
func (r *Ref) TokenizeBatch(model string, texts []string, addSpecial, parseSpecial bool) ([][]int32, error) {
	m, err := absModel(model)
	if err != nil {
		return nil, err
	}
	for i, t := range texts {
		if !utf8.ValidString(t) {
			return nil, fmt.Errorf("llamaref: tokenize text %d: %w", i, ErrInvalidUTF8)
		}
	}
	if texts == nil {
		texts = []string{}
	}
	var res struct {
		Tokens [][]int32 `json:"tokens"`
	}
	if err := r.call("tokenize", map[string]any{"model": m, "texts": texts, "addSpecial": addSpecial, "parseSpecial": parseSpecial}, &res); err != nil {
		return nil, err
	}
	if len(res.Tokens) != len(texts) {
		return nil, fmt.Errorf("llamaref: tokenize: %d results for %d texts", len(res.Tokens), len(texts))
	}
	for i := range res.Tokens {
		if res.Tokens[i] == nil {
			res.Tokens[i] = []int32{}
		}
	}
	return res.Tokens, nil
}

// Detokenize returns llama_detokenize(vocab, ids, removeSpecial, unparseSpecial) with invalid
// UTF-8 replaced by U+FFFD (see the package doc; Piece gives raw bytes).
func (r *Ref) Detokenize(model string, ids []int32, removeSpecial, unparseSpecial bool) (string, error) {
	m, err := absModel(model)
	if err != nil {
		return "", err
	}
	if ids == nil {
		ids = []int32{}
	}
	var res struct {
		Text string `json:"text"`
	}
	if err := r.call("detokenize", map[string]any{"model": m, "ids": ids, "removeSpecial": removeSpecial, "unparseSpecial": unparseSpecial}, &res); err != nil {
		return "", err
	}
	return res.Text, nil
}

// Piece returns llama_token_to_piece(vocab, id, lstrip=0, special) as raw bytes (a byte token's
// piece is a single, possibly non-UTF-8, byte).
func (r *Ref) Piece(model string, id int32, special bool) ([]byte, error) {
	p, err := r.Pieces(model, []int32{id}, special)
	if err != nil {
		return nil, err
	}
	return p[0], nil
}

// Pieces is Piece for many ids in one round trip.
func (r *Ref) Pieces(model string, ids []int32, special bool) ([][]byte, error) {
	m, err := absModel(model)
	if err != nil {
		return nil, err
	}
	if ids == nil {
		ids = []int32{}
	}
	var res struct {
		Pieces [][]byte `json:"pieces"` // base64 on the wire
	}
	if err := r.call("piece", map[string]any{"model": m, "ids": ids, "special": special}, &res); err != nil {
		return nil, err
	}
	if len(res.Pieces) != len(ids) {
		return nil, fmt.Errorf("llamaref: piece: %d results for %d ids", len(res.Pieces), len(ids))
	}
	for i := range res.Pieces {
		if res.Pieces[i] == nil {
			res.Pieces[i] = []byte{}
		}
	}
	return res.Pieces, nil
}

// ModelInfo returns what llama.cpp reports about a model: vocab_type ("spm", "bpe", ...),
// n_vocab, bos, eos, eot, sep, nl (-1 when absent), add_bos, add_eos, eog (all end-of-generation
// ids), tokenizer_model, tokenizer_pre, architecture, name, n_ctx_train, n_embd, vocab_only, and,
// once the weights are loaded (after LogProbs/Logits/Greedy), n_params, size and description.
// Numbers are float64 (JSON).
func (r *Ref) ModelInfo(model string) (map[string]any, error) {
	m, err := absModel(model)
	if err != nil {
		return nil, err
	}
	var res map[string]any
	if err := r.call("info", map[string]any{"model": m}, &res); err != nil {
		return nil, err
	}
	delete(res, "id")
	delete(res, "ok")
	return res, nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu   sync.Mutex
	max  int
	buf  []byte
	echo bool
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.echo {
		_, _ = os.Stderr.Write(p)
	}
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.max {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(bytes.ToValidUTF8(t.buf, []byte("?"))))
}
