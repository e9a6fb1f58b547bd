package metrics

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/cacheblend/cacheblend/contract"
	"github.com/prometheus/client_golang/prometheus"
)

// DefaultLabelCap is the number of distinct values a capped label keeps per label key and
// Registry before recording further values as [OtherValue].
const DefaultLabelCap = 64

// OtherValue is recorded for a capped label once its distinct values are exhausted, and for a
// capped label value that is not valid UTF-8 (see RecordStats.InvalidLabelValues).
const OtherValue = contract.OtherValue

// maxCachedSeries bounds the lock-free lookup cache of one instrument; series beyond it are
// still recorded, through the slower locked path.
const maxCachedSeries = 4096

// maxPrecreated bounds the series pre-created for instruments whose labels all have allowed
// lists.
const maxPrecreated = 256

// Sentinel errors; test with errors.Is.
var (
	// ErrUnknownMetric: the name is not in the contract.
	ErrUnknownMetric = errors.New("metrics: metric not in the contract")
	// ErrWrongType: the contract declares the name with another type.
	ErrWrongType = errors.New("metrics: metric has another type in the contract")
	// ErrNegative: a counter increment, total or observation below zero.
	ErrNegative = errors.New("metrics: negative value")
	// ErrNaN: a NaN value.
	ErrNaN = errors.New("metrics: NaN value")
	// ErrInfinite: an infinite value.
	ErrInfinite = errors.New("metrics: infinite value")
	// ErrCounterDecrease: SetTotal with a total lower than the previous one.
	ErrCounterDecrease = errors.New("metrics: counter total lower than before")
	// ErrInvalidRecord: a record or stats value that is inconsistent (e.g. TTFT after the end,
	// KV blocks not summing to the pool).
	ErrInvalidRecord = errors.New("metrics: invalid record")
)

// LabelReason says why label values were refused.
type LabelReason string

// Reasons of a LabelError.
const (
	// ReasonNotAllowed: the value is not in the label's allowed list.
	ReasonNotAllowed LabelReason = "value not allowed"
	// ReasonMissing: fewer label values than label keys.
	ReasonMissing LabelReason = "missing label values"
	// ReasonExtra: more label values than label keys.
	ReasonExtra LabelReason = "extra label values"
)

// LabelError reports label values the contract does not accept: returned by the methods that
// resolve series (Counter.Series, the facade constructors...), and passed to the OnRefused
// handler when a record method is refused. Nothing is recorded.
type LabelError struct {
	// Metric is the instrument name.
	Metric string
	// Label is the offending key ("" for a count mismatch).
	Label string
	// Value is the offending value.
	Value string
	// Reason says what is wrong.
	Reason LabelReason
	// Want lists the allowed values (ReasonNotAllowed) or the label keys (count mismatch).
	Want []string
}

// Error describes the refusal.
func (e *LabelError) Error() string {
	switch e.Reason {
	case ReasonMissing, ReasonExtra:
		return fmt.Sprintf("metrics: %s: %s: want values for %v", e.Metric, e.Reason, e.Want)
	case ReasonNotAllowed:
		return fmt.Sprintf("metrics: %s: label %s: %s %q (allowed %q)", e.Metric, e.Label, e.Reason, e.Value, e.Want)
	}
	return fmt.Sprintf("metrics: %s: label %s: %s %q", e.Metric, e.Label, e.Reason, e.Value)
}

// Config holds the optional settings; the zero value is ready to use.
type Config struct {
	// LabelCap is the number of distinct values a capped label keeps per label key before
	// recording OtherValue. Zero or negative means DefaultLabelCap (64).
	LabelCap int
	// Contract is the instrument set the facades (NewEngineMetrics etc.) build from. Nil means
	// the embedded contract (contract.Instruments()). NewRegistry takes its set as a parameter
	// and ignores this field.
	Contract *contract.InstrumentSet
	// OnRefused, if non-nil, receives the reason of every refused record (see Registry): a
	// *LabelError or an error wrapping ErrNegative, ErrNaN, ErrInfinite, ErrCounterDecrease or
	// ErrInvalidRecord. It is called synchronously by the record method, never while the
	// registry or a facade holds a lock, possibly from many goroutines at once: it must be safe
	// for concurrent use and should be cheap (e.g. a log line). Nil means refusals are only
	// counted (RecordStats.Refused).
	OnRefused func(error)
}

// Option changes a Config.
type Option func(*Config)

// WithLabelCap sets Config.LabelCap.
func WithLabelCap(n int) Option { return func(c *Config) { c.LabelCap = n } }

// WithContract sets Config.Contract.
func WithContract(set *contract.InstrumentSet) Option {
	return func(c *Config) { c.Contract = set }
}

// WithOnRefused sets Config.OnRefused.
func WithOnRefused(f func(error)) Option { return func(c *Config) { c.OnRefused = f } }

func buildConfig(opts []Option) Config {
	var c Config
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if c.LabelCap <= 0 {
		c.LabelCap = DefaultLabelCap
	}
	return c
}

// Registry builds client_golang instruments from contract instruments and registers them on
// a prometheus.Registerer. Instruments are created on first request and shared afterwards.
// Safe for concurrent use.
//
// Record methods (Add, Inc, Set, SetTotal, Observe, ObserveContext, and the facades' record
// methods) return nothing. A record they cannot take as given is handled in one of two ways:
//
//   - A capped label value that is not valid UTF-8 is recorded as OtherValue, like a value
//     beyond the cap, and counted in RecordStats.InvalidLabelValues.
//   - Anything else wrong is refused: nothing at all is recorded, the refusal is counted in
//     RecordStats.Refused and its reason passed to Config.OnRefused. That covers label values
//     outside a label's allowed list or a wrong number of them (programming errors: the
//     facades take typed constants where the caller picks the value), negative, NaN and
//     infinite values where they are not allowed, counter totals going down and inconsistent
//     records (ErrInvalidRecord).
//
// Nothing panics on bad input. Errors are returned only where series are resolved — Registry's
// instrument getters, the Series methods and the facade constructors — so that a contract
// mismatch is a startup error.
type Registry struct {
	reg  prometheus.Registerer
	set  *contract.InstrumentSet
	cfg  Config
	sink *recordSink

	mu          sync.Mutex
	instruments map[string]*instrument
	caps        map[string]*capSet
}

// NewRegistry returns a Registry registering on reg the instruments of set. Options: a label
// cap (WithLabelCap). Both reg and set are required.
func NewRegistry(reg prometheus.Registerer, set *contract.InstrumentSet, opts ...Option) (*Registry, error) {
	if reg == nil {
		return nil, errors.New("metrics: new registry: nil Registerer")
	}
	if set == nil {
		return nil, errors.New("metrics: new registry: nil instrument set")
	}
	cfg := buildConfig(opts)
	return &Registry{
		reg:         reg,
		set:         set,
		cfg:         cfg,
		sink:        &recordSink{onRefused: cfg.OnRefused},
		instruments: map[string]*instrument{},
		caps:        map[string]*capSet{},
	}, nil
}

// RecordStats are a Registry's running totals of the records its record methods (and those of
// the facade built on it) could not take as given. See Registry.
type RecordStats struct {
	// Refused counts record calls that recorded nothing; each was also passed to
	// Config.OnRefused.
	Refused uint64
	// InvalidLabelValues counts capped label values that were not valid UTF-8 and were recorded
	// as OtherValue, once per series lookup (a facade method recording into several instruments
	// counts once per instrument).
	InvalidLabelValues uint64
}

// RecordStats returns the registry's record totals. Safe for concurrent use.
func (r *Registry) RecordStats() RecordStats {
	return RecordStats{Refused: r.sink.refused.Load(), InvalidLabelValues: r.sink.invalid.Load()}
}

// recordSink counts what the record methods of one Registry could not take as given.
type recordSink struct {
	refused   atomic.Uint64
	invalid   atomic.Uint64
	onRefused func(error)
}

// refuse counts a refused record and reports err to the handler. Callers hold no lock.
func (k *recordSink) refuse(err error) {
	k.refused.Add(1)
	if k.onRefused != nil {
		k.onRefused(err)
	}
}

// refuseErr refuses err when it is not nil.
func (k *recordSink) refuseErr(err error) {
	if err != nil {
		k.refuse(err)
	}
}

// Contract returns the instrument set the registry builds from (read-only).
func (r *Registry) Contract() *contract.InstrumentSet { return r.set }

// Registered returns the names of the instruments created so far, sorted.
func (r *Registry) Registered() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	names := slices.Collect(maps.Keys(r.instruments))
	slices.Sort(names)
	return names
}

// Counter returns the contract counter named name, registering it on first use.
func (r *Registry) Counter(name string) (*Counter, error) {
	in, err := r.instrument(name, contract.Counter)
	if err != nil {
		return nil, err
	}
	return &Counter{in: in}, nil
}

// Gauge returns the contract gauge named name, registering it on first use.
func (r *Registry) Gauge(name string) (*Gauge, error) {
	in, err := r.instrument(name, contract.Gauge)
	if err != nil {
		return nil, err
	}
	return &Gauge{in: in}, nil
}

// Histogram returns the contract histogram named name, registering it on first use.
func (r *Registry) Histogram(name string) (*Histogram, error) {
	in, err := r.instrument(name, contract.Histogram)
	if err != nil {
		return nil, err
	}
	return &Histogram{in: in}, nil
}

func (r *Registry) instrument(name string, kind contract.Kind) (*instrument, error) {
	def, ok := r.set.Lookup(name)
	if !ok {
		return nil, fmt.Errorf("metrics: %q: %w", name, ErrUnknownMetric)
	}
	if def.Type != kind {
		return nil, fmt.Errorf("metrics: %q is a %s, not a %s: %w", name, def.Type, kind, ErrWrongType)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if in, ok := r.instruments[name]; ok {
		return in, nil
	}
	if len(def.Labels) > contract.MaxLabels {
		return nil, fmt.Errorf("metrics: %q has %d labels, at most %d supported", name, len(def.Labels), contract.MaxLabels)
	}
	in, err := r.newInstrument(def)
	if err != nil {
		return nil, err
	}
	r.instruments[name] = in
	return in, nil
}

// newInstrument builds and registers the collector; r.mu is held.
func (r *Registry) newInstrument(def *contract.Instrument) (*instrument, error) {
	in := &instrument{
		name:      def.Name,
		arity:     len(def.Labels),
		exemplars: def.Exemplars,
		sink:      r.sink,
		resolved:  map[[contract.MaxLabels]string]*series{},
	}
	for i := range def.Labels {
		l := &def.Labels[i]
		p := labelPolicy{key: l.Key}
		if l.Capped {
			cs, ok := r.caps[l.Key]
			if !ok {
				cs = &capSet{limit: r.cfg.LabelCap, admitted: map[string]struct{}{}}
				r.caps[l.Key] = cs
			}
			p.cap = cs
		} else {
			p.allowedList = slices.Clone(l.Allowed)
			p.allowed = make(map[string]struct{}, len(l.Allowed))
			for _, v := range l.Allowed {
				p.allowed[v] = struct{}{}
			}
		}
		in.policies = append(in.policies, p)
	}

	keys := def.LabelKeys()
	var coll prometheus.Collector
	switch def.Type {
	case contract.Counter:
		in.counterVec = prometheus.NewCounterVec(prometheus.CounterOpts{Name: def.Name, Help: def.Help, Unit: def.PromUnit()}, keys)
		coll = in.counterVec
	case contract.Gauge:
		in.gaugeVec = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: def.Name, Help: def.Help, Unit: def.PromUnit()}, keys)
		coll = in.gaugeVec
	case contract.Histogram:
		in.histVec = prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: def.Name, Help: def.Help, Unit: def.PromUnit(), Buckets: slices.Clone(def.Buckets),
		}, keys)
		coll = in.histVec
	default:
		return nil, fmt.Errorf("metrics: %q: unsupported type %q", def.Name, def.Type)
	}
	if err := r.reg.Register(coll); err != nil {
		// Another facade on the same Registerer already registered this contract instrument
		// (e.g. cb_kv_transfer_bytes_total from both engine and worker): share its collector.
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			return nil, fmt.Errorf("metrics: register %q: %w", def.Name, err)
		}
		switch existing := are.ExistingCollector.(type) {
		case *prometheus.CounterVec:
			in.counterVec = existing
		case *prometheus.GaugeVec:
			in.gaugeVec = existing
		case *prometheus.HistogramVec:
			in.histVec = existing
		default:
			return nil, fmt.Errorf("metrics: register %q: %w", def.Name, err)
		}
		if (def.Type == contract.Counter) != (in.counterVec != nil) || (def.Type == contract.Gauge) != (in.gaugeVec != nil) ||
			(def.Type == contract.Histogram) != (in.histVec != nil) {
			return nil, fmt.Errorf("metrics: register %q: %w", def.Name, err)
		}
	}
	if err := in.precreate(); err != nil {
		return nil, err
	}
	return in, nil
}

// capSet admits at most limit distinct values of one capped label key.
type capSet struct {
	limit    int
	mu       sync.Mutex
	admitted map[string]struct{}
}

// resolve returns the value to record for v and whether that mapping is permanent for v and
// worth caching (false for overflow values, so the cache cannot grow without bound).
func (c *capSet) resolve(v string) (string, bool) {
	if v == OtherValue {
		return OtherValue, true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.admitted[v]; ok {
		return v, true
	}
	if len(c.admitted) < c.limit {
		c.admitted[strings.Clone(v)] = struct{}{}
		return v, true
	}
	return OtherValue, false
}

type labelPolicy struct {
	key         string
	allowed     map[string]struct{} // nil when capped
	allowedList []string
	cap         *capSet // nil when the label has an allowed list
}

// series is one resolved child of a vec.
type series struct {
	name    string // the instrument's
	counter prometheus.Counter
	gauge   prometheus.Gauge
	obs     prometheus.Observer
	exo     prometheus.ExemplarObserver // nil if the observer offers no exemplars

	mu    sync.Mutex // guards total
	total float64    // last SetTotal
}

// instrument is one registered contract instrument with its series cache.
type instrument struct {
	name      string
	arity     int
	exemplars bool
	policies  []labelPolicy
	sink      *recordSink // the registry's

	counterVec *prometheus.CounterVec
	gaugeVec   *prometheus.GaugeVec
	histVec    *prometheus.HistogramVec

	// cache maps raw label values to series; read with one atomic load and no lock.
	// Unlabelled instruments keep their only series at the root.
	cache trie[*series]

	mu       sync.Mutex // guards resolved, cached and cache writes
	resolved map[[contract.MaxLabels]string]*series
	cached   int
}

// lookup returns the series for raw label values lvs (in contract order). It fails only for a
// wrong number of values or a value outside an allowed list; capped values never fail (see
// resolve). The cached path performs no allocation and takes no lock.
func (in *instrument) lookup(lvs []string) (*series, error) {
	if len(lvs) != in.arity {
		return nil, in.arityError(len(lvs))
	}
	if s, ok := in.cache.get(lvs); ok {
		return s, nil
	}
	s, _, err := in.resolve(lvs)
	return s, err
}

// lookupStable is lookup that also reports whether the raw values map to the series for good
// (false for values beyond a label cap, recorded as OtherValue but not cached).
func (in *instrument) lookupStable(lvs []string) (*series, bool, error) {
	if len(lvs) != in.arity {
		return nil, false, in.arityError(len(lvs))
	}
	if s, ok := in.cache.get(lvs); ok {
		return s, true, nil
	}
	return in.resolve(lvs)
}

func (in *instrument) arityError(n int) error {
	keys := make([]string, len(in.policies))
	for i, p := range in.policies {
		keys[i] = p.key
	}
	reason := ReasonMissing
	if n > in.arity {
		reason = ReasonExtra
	}
	return &LabelError{Metric: in.name, Reason: reason, Want: keys}
}

// resolve validates raw values, applies caps, and finds or creates the series; stable is false
// when a capped value overflowed or was not valid UTF-8 (both recorded as OtherValue, neither
// cached nor admitted by the cap).
func (in *instrument) resolve(lvs []string) (s *series, stable bool, err error) {
	// Validate everything before a cap admits anything.
	for i, v := range lvs {
		p := &in.policies[i]
		if p.cap == nil {
			if _, ok := p.allowed[v]; !ok {
				return nil, false, &LabelError{Metric: in.name, Label: p.key, Value: v, Reason: ReasonNotAllowed, Want: p.allowedList}
			}
		}
	}
	var key [contract.MaxLabels]string
	stable = true
	for i, v := range lvs {
		p := &in.policies[i]
		switch {
		case p.cap == nil:
			key[i] = v
		case !utf8.ValidString(v):
			in.sink.invalid.Add(1)
			key[i], stable = OtherValue, false
		default:
			r, ok := p.cap.resolve(v)
			key[i] = r
			stable = stable && ok
		}
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	s = in.resolved[key]
	if s == nil {
		if s, err = in.newSeries(key[:in.arity]); err != nil {
			return nil, false, err
		}
		in.resolved[cloneKey(key)] = s
	}
	if stable && in.cached < maxCachedSeries {
		in.cache.insert(lvs, s)
		in.cached++
	}
	return s, stable, nil
}

func cloneKey(k [contract.MaxLabels]string) [contract.MaxLabels]string {
	for i := range k {
		k[i] = strings.Clone(k[i])
	}
	return k
}

// newSeries creates the vec child for resolved values; in.mu is held.
func (in *instrument) newSeries(vals []string) (*series, error) {
	vals = slices.Clone(vals)
	s := &series{name: in.name}
	var err error
	switch {
	case in.counterVec != nil:
		s.counter, err = in.counterVec.GetMetricWithLabelValues(vals...)
	case in.gaugeVec != nil:
		s.gauge, err = in.gaugeVec.GetMetricWithLabelValues(vals...)
	case in.histVec != nil:
		s.obs, err = in.histVec.GetMetricWithLabelValues(vals...)
		if exo, ok := s.obs.(prometheus.ExemplarObserver); ok && err == nil {
			s.exo = exo
		}
	}
	if err != nil {
		return nil, fmt.Errorf("metrics: %s: series %q: %w", in.name, vals, err)
	}
	return s, nil
}

// precreate makes the series that should exist at zero before any event: the only series of
// an unlabelled instrument, and every combination when all labels have (few) allowed values.
func (in *instrument) precreate() error {
	if in.arity == 0 {
		in.mu.Lock()
		defer in.mu.Unlock()
		s, err := in.newSeries(nil)
		if err != nil {
			return err
		}
		in.cache.insert(nil, s)
		return nil
	}
	combos := 1
	for _, p := range in.policies {
		if p.cap != nil {
			return nil
		}
		combos *= len(p.allowedList)
	}
	if combos > maxPrecreated {
		return nil
	}
	idx := make([]int, in.arity)
	lvs := make([]string, in.arity)
	for {
		for i, p := range in.policies {
			lvs[i] = p.allowedList[idx[i]]
		}
		if _, err := in.lookup(lvs); err != nil {
			return err
		}
		i := in.arity - 1
		for ; i >= 0; i-- {
			if idx[i]++; idx[i] < len(in.policies[i].allowedList) {
				break
			}
			idx[i] = 0
		}
		if i < 0 {
			return nil
		}
	}
}

// validValue reports whether v is finite and (unless negOK) not negative. Small enough to
// inline.
func validValue(v float64, negOK bool) bool {
	return (v >= 0 || negOK && v < 0) && v <= math.MaxFloat64 && v >= -math.MaxFloat64
}

// accepts reports whether v is a value to record (see validValue), refusing it if not.
func (in *instrument) accepts(v float64, negOK bool) bool {
	if validValue(v, negOK) {
		return true
	}
	var err error
	switch {
	case math.IsNaN(v):
		err = fmt.Errorf("metrics: %s: %w", in.name, ErrNaN)
	case math.IsInf(v, 0):
		err = fmt.Errorf("metrics: %s: %v: %w", in.name, v, ErrInfinite)
	default:
		err = fmt.Errorf("metrics: %s: %v: %w", in.name, v, ErrNegative)
	}
	in.sink.refuse(err)
	return false
}

// take returns the series of lvs to record v into, or nil after refusing v (see accepts) or
// label values lookup rejects.
func (in *instrument) take(v float64, negOK bool, lvs []string) *series {
	if !in.accepts(v, negOK) {
		return nil
	}
	s, err := in.lookup(lvs)
	if err != nil {
		in.sink.refuse(err)
		return nil
	}
	return s
}
