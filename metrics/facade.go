package metrics

import (
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/cacheblend/cacheblend/contract"
	"github.com/prometheus/client_golang/prometheus"
)

// Instrument names used by the facades. They are the contract's names, character for
// character; the tests check every facade registers exactly the instruments it owns.
const (
	NameTTFT            = "gen_ai_server_time_to_first_token_seconds"
	NameTPOT            = "gen_ai_server_time_per_output_token_seconds"
	NameRequestDuration = "gen_ai_server_request_duration_seconds"
	NameHTTPDuration    = "http_server_request_duration_seconds"
)

// facade is embedded by every facade: the registry it registers through.
type facade struct{ reg *Registry }

// Registry returns the registry the facade registers through (its RecordStats count the
// facade's refusals).
func (f facade) Registry() *Registry { return f.reg }

// newFacade builds the facade what: a Registry for the contract from the options (default: the
// embedded one) on reg, and the facade's instruments and fixed series, asked for by build
// through a builder; any error there is the constructor's (a startup error).
func newFacade[T any](what string, reg prometheus.Registerer, opts []Option, build func(*builder) *T) (*T, error) {
	set := buildConfig(opts).Contract
	if set == nil {
		var err error
		if set, err = contract.Instruments(); err != nil {
			return nil, fmt.Errorf("metrics: %s: load contract: %w", what, err)
		}
	}
	r, err := NewRegistry(reg, set, opts...)
	if err != nil {
		return nil, fmt.Errorf("metrics: %s: %w", what, err)
	}
	b := &builder{r: r}
	m := build(b)
	if b.err != nil {
		return nil, fmt.Errorf("metrics: %s: %w", what, b.err)
	}
	return m, nil
}

// builder collects the first error while a facade asks the registry for its instruments and
// resolves its fixed series.
type builder struct {
	r   *Registry
	err error
}

func (b *builder) counter(name string) *Counter {
	c, err := b.r.Counter(name)
	b.keep(err)
	return c
}

func (b *builder) gauge(name string) *Gauge {
	g, err := b.r.Gauge(name)
	b.keep(err)
	return g
}

func (b *builder) histogram(name string) *Histogram {
	h, err := b.r.Histogram(name)
	b.keep(err)
	return h
}

// fixed resolves one series of the instrument name of kind up front (fixed label values).
func (b *builder) fixed(kind contract.Kind, name string, lvs []string) (*instrument, *series) {
	in, err := b.r.instrument(name, kind)
	b.keep(err)
	if in == nil {
		return nil, nil
	}
	return in, b.series(in, lvs)
}

func (b *builder) gaugeSeries(name string, lvs ...string) *series {
	_, s := b.fixed(contract.Gauge, name, lvs)
	return s
}

func (b *builder) counterSeries(name string, lvs ...string) *series {
	_, s := b.fixed(contract.Counter, name, lvs)
	return s
}

// histogramSeries resolves the only series of an unlabelled histogram up front.
func (b *builder) histogramSeries(name string) *HistogramSeries {
	in, s := b.fixed(contract.Histogram, name, nil)
	if s == nil {
		return nil
	}
	return &HistogramSeries{in: in, s: s}
}

// enum resolves the series of the instrument name of kind, whose one label an enum names: one
// per value of names, in order.
func (b *builder) enum(kind contract.Kind, name string, names []string) enumSeries {
	in, err := b.r.instrument(name, kind)
	b.keep(err)
	e := enumSeries{in: in}
	for _, v := range names {
		if in != nil {
			e.ss = append(e.ss, b.series(in, []string{v}))
		}
	}
	return e
}

func (b *builder) series(in *instrument, lvs []string) *series {
	s, err := in.lookup(lvs)
	b.keep(err)
	return s
}

func (b *builder) keep(err error) {
	if b.err == nil && err != nil {
		b.err = err
	}
}

// enumSeries are the series of an instrument with one label, one per value of the enum naming
// it, in the enum's order.
type enumSeries struct {
	in *instrument
	ss []*series
}

// refuse refuses value, which is not one of the label's allowed values.
func (e enumSeries) refuse(value string) {
	p := &e.in.policies[0]
	e.in.sink.refuse(&LabelError{Metric: e.in.name, Label: p.key, Value: value, Reason: ReasonNotAllowed, Want: p.allowedList})
}

// pick returns the series of v, or refuses a v that is not a constant of E and returns nil.
func pick[E labelEnum](e enumSeries, v E) *series {
	if int(v) < len(e.ss) {
		return e.ss[v]
	}
	e.refuse(v.String())
	return nil
}

// kvTransfer records cb_kv_transfer_{bytes,tokens}_total (the worker's), one series per
// KVDirection.
type kvTransfer struct{ bytes, tokens enumSeries }

func newKVTransfer(b *builder) kvTransfer {
	return kvTransfer{
		bytes:  b.enum(contract.Counter, "cb_kv_transfer_bytes_total", kvDirectionNames[:]),
		tokens: b.enum(contract.Counter, "cb_kv_transfer_tokens_total", kvDirectionNames[:]),
	}
}

// add validates both values and the direction before recording either; a refusal records
// neither.
func (k *kvTransfer) add(d KVDirection, bytes, tokens int64) {
	if bytes < 0 || tokens < 0 {
		k.bytes.in.sink.refuse(fmt.Errorf("metrics: kv transfer: bytes %d tokens %d: %w", bytes, tokens, ErrNegative))
		return
	}
	if sb := pick(k.bytes, d); sb != nil {
		sb.counter.Add(float64(bytes))
		k.tokens.ss[d].counter.Add(float64(tokens))
	}
}

// genAIRequests are the GenAI request histograms (gen_ai_server_*), recorded by the engine and
// by the gateway.
type genAIRequests struct{ ttft, tpot, duration *Histogram }

func newGenAIRequests(b *builder) genAIRequests {
	return genAIRequests{
		ttft:     b.histogram(NameTTFT),
		tpot:     b.histogram(NameTPOT),
		duration: b.histogram(NameRequestDuration),
	}
}

// checkRequest validates the durations and counts of the request record what: none negative
// (ErrNegative) and a TTFT, when there is one, not after the end (ErrInvalidRecord).
func checkRequest(what string, e2e, ttft time.Duration, hasTTFT bool, counts ...int) error {
	if e2e < 0 || ttft < 0 || slices.ContainsFunc(counts, func(n int) bool { return n < 0 }) {
		return fmt.Errorf("metrics: %s: %w", what, ErrNegative)
	}
	if hasTTFT && ttft > e2e {
		return fmt.Errorf("metrics: %s: ttft %v after e2e %v: %w", what, ttft, e2e, ErrInvalidRecord)
	}
	return nil
}

// timePerToken is TPOT = (e2e − ttft)/(n − 1), for n ≥ 2 output tokens.
func timePerToken(e2e, ttft time.Duration, n int) time.Duration {
	return (e2e - ttft) / time.Duration(n-1)
}

// httpMethods are the methods HTTP semantic conventions keep; any other becomes "_OTHER".
var httpMethods = map[string]string{
	"GET": "GET", "POST": "POST", "PUT": "PUT", "DELETE": "DELETE", "PATCH": "PATCH",
	"HEAD": "HEAD", "OPTIONS": "OPTIONS",
}

// statusCodes holds the label value of every valid status code, so recording allocates nothing.
var statusCodes = func() (t [600]string) {
	for i := 100; i < len(t); i++ {
		t[i] = strconv.Itoa(i)
	}
	return t
}()

// statusLabel is the label value of an HTTP status code: OtherValue (and false) outside
// 100–599.
func statusLabel(status int) (string, bool) {
	if status >= 100 && status < len(statusCodes) {
		return statusCodes[status], true
	}
	return OtherValue, false
}

// recordHTTP records one HTTP server request into h (http_server_request_duration_seconds):
// see EngineMetrics.RecordHTTP.
func recordHTTP(h *Histogram, method, route string, status int, seconds float64) {
	meth, ok := httpMethods[method]
	if !ok {
		meth = "_OTHER"
	}
	code, ok := statusLabel(status)
	if !ok && validValue(seconds, false) {
		h.in.sink.invalid.Add(1)
	}
	h.Observe(seconds, meth, route, code)
}
