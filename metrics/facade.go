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

// builder collects the first error while a facade asks the registry for its instruments.
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

// kvTransfer records cb_kv_transfer_{bytes,tokens}_total; shared by engine and worker.
type kvTransfer struct {
	bytes, tokens *Counter
}

func newKVTransfer(b *builder) kvTransfer {
	return kvTransfer{
		bytes:  b.counter("cb_kv_transfer_bytes_total"),
		tokens: b.counter("cb_kv_transfer_tokens_total"),
	}
}

// add validates both values and the direction before recording either.
func (k kvTransfer) add(direction string, bytes, tokens int64) error {
	if bytes < 0 || tokens < 0 {
		return fmt.Errorf("metrics: kv transfer: bytes %d tokens %d: %w", bytes, tokens, ErrNegative)
	}
	sb, err := k.bytes.in.lookup([]string{direction})
	if err != nil {
		return err
	}
	st, err := k.tokens.in.lookup([]string{direction})
	if err != nil {
		return err
	}
	sb.counter.Add(float64(bytes))
	st.counter.Add(float64(tokens))
	return nil
}
