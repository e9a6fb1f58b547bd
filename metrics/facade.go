package metrics

import (
	"fmt"

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

// newFacadeRegistry builds the Registry a facade registers through: the contract from the
// options (default: the embedded one) on reg.
func newFacadeRegistry(what string, reg prometheus.Registerer, opts []Option) (*Registry, error) {
	cfg := buildConfig(opts)
	set := cfg.Contract
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
	return r, nil
}

// builder collects the first error while a facade asks the registry for its instruments and
// resolves its fixed series: any error there is the constructor's (a startup error).
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

// gaugeSeries resolves one series of a gauge up front (fixed label values).
func (b *builder) gaugeSeries(name string, lvs ...string) *series {
	g := b.gauge(name)
	if g == nil {
		return nil
	}
	return b.series(g.in, lvs)
}

// counterSeries resolves one series of a counter up front (fixed label values).
func (b *builder) counterSeries(name string, lvs ...string) *series {
	c := b.counter(name)
	if c == nil {
		return nil
	}
	return b.series(c.in, lvs)
}

// histogramSeries resolves the only series of an unlabelled histogram up front.
func (b *builder) histogramSeries(name string) *HistogramSeries {
	h := b.histogram(name)
	if h == nil {
		return nil
	}
	s := b.series(h.in, nil)
	if s == nil {
		return nil
	}
	return &HistogramSeries{in: h.in, s: s}
}

// enumSeries fills dst with the series of in (whose one label an enum names) for each of
// names, in order.
func (b *builder) enumSeries(dst []*series, in *instrument, names []string) {
	if in == nil {
		return
	}
	for i, v := range names {
		dst[i] = b.series(in, []string{v})
	}
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

// instrumentOf returns c's instrument, nil for a nil c (a builder error).
func instrumentOf(c *Counter) *instrument {
	if c == nil {
		return nil
	}
	return c.in
}

// kvTransfer records cb_kv_transfer_{bytes,tokens}_total (the worker's). Its
// series are resolved by the constructor, one per KVDirection.
type kvTransfer struct {
	bytesIn       *instrument
	bytes, tokens [len(kvDirectionNames)]*series
}

func newKVTransfer(b *builder) kvTransfer {
	bytes := instrumentOf(b.counter("cb_kv_transfer_bytes_total"))
	tokens := instrumentOf(b.counter("cb_kv_transfer_tokens_total"))
	k := kvTransfer{bytesIn: bytes}
	b.enumSeries(k.bytes[:], bytes, kvDirectionNames[:])
	b.enumSeries(k.tokens[:], tokens, kvDirectionNames[:])
	return k
}

// add validates both values and the direction before recording either; a refusal records
// neither.
func (k *kvTransfer) add(d KVDirection, bytes, tokens int64) {
	if bytes < 0 || tokens < 0 {
		k.bytesIn.sink.refuse(fmt.Errorf("metrics: kv transfer: bytes %d tokens %d: %w", bytes, tokens, ErrNegative))
		return
	}
	sb := pick(k.bytesIn, k.bytes[:], d)
	if sb == nil {
		return
	}
	sb.counter.Add(float64(bytes))
	k.tokens[d].counter.Add(float64(tokens))
}
