package contract

import (
	"math"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"
)

// Kind is an instrument type.
type Kind string

// The instrument kinds of the contract.
const (
	Counter   Kind = "counter"
	Gauge     Kind = "gauge"
	Histogram Kind = "histogram"
)

// Owners: the facades of package metrics that register an instrument.
const (
	OwnerEngine  = "engine"
	OwnerWorker  = "worker"
	OwnerBlend   = "blend"
	OwnerProcess = "process"
	// OwnerGateway is the gateway's facade (cb gateway).
	OwnerGateway = "gateway"
)

// MaxLabels is the most label keys an instrument may declare.
const MaxLabels = 8

// OtherValue is the value a capped label records once its distinct values are exhausted. It
// may not appear in an allowed-value list.
const OtherValue = "_other"

// Label is one label key of an instrument: either a closed list of allowed values or a capped,
// user-fed value.
type Label struct {
	// Key is the label name, e.g. "gen_ai_request_model".
	Key string `yaml:"key"`
	// Allowed is the complete list of values the label may take (may include "").
	Allowed []string `yaml:"allowed"`
	// Capped marks a user-fed label: package metrics keeps at most a fixed number of distinct
	// values per process (64 by default) and records the rest as OtherValue.
	Capped bool `yaml:"capped"`
}

// Allows reports whether v is a legal value of the label: listed in Allowed, or any valid
// UTF-8 string when the label is capped.
func (l *Label) Allows(v string) bool {
	if l.Capped {
		return utf8.ValidString(v)
	}
	return slices.Contains(l.Allowed, v)
}

// Instrument is one metric of the contract.
type Instrument struct {
	// Name is the Prometheus metric name.
	Name string `yaml:"name"`
	// Type is counter, gauge or histogram.
	Type Kind `yaml:"type"`
	// Help is the HELP text, exposed verbatim.
	Help string `yaml:"help"`
	// Unit is the UCUM-style unit: s, By, 1, GBy/s, or a {annotation}.
	Unit string `yaml:"unit"`
	// Owners lists the facades registering the instrument (engine, worker, blend, process,
	// gateway).
	Owners []string `yaml:"owners"`
	// Exemplars is true when observations carry trace exemplars (histograms only).
	Exemplars bool `yaml:"exemplars"`
	// Labels are the label keys in exposition order.
	Labels []Label `yaml:"labels"`
	// Buckets are the histogram upper bounds, strictly increasing; +Inf is implicit.
	Buckets []float64 `yaml:"buckets"`
}

// LabelKeys returns the label keys in contract order.
func (in *Instrument) LabelKeys() []string {
	keys := make([]string, len(in.Labels))
	for i := range in.Labels {
		keys[i] = in.Labels[i].Key
	}
	return keys
}

// Label returns the label with the given key.
func (in *Instrument) Label(key string) (*Label, bool) {
	for i := range in.Labels {
		if in.Labels[i].Key == key {
			return &in.Labels[i], true
		}
	}
	return nil, false
}

// HasBound reports whether b is exactly one of the histogram's bucket bounds.
func (in *Instrument) HasBound(b float64) bool { return slices.Contains(in.Buckets, b) }

// OwnedBy reports whether the facade named owner registers the instrument.
func (in *Instrument) OwnedBy(owner string) bool { return slices.Contains(in.Owners, owner) }

// unitSuffix maps units that impose a name suffix to that suffix word.
var unitSuffix = map[string]string{
	"s":     "seconds",
	"By":    "bytes",
	"1":     "ratio",
	"GBy/s": "gbps",
}

// suffixUnit maps a name suffix word to the only unit it may carry.
var suffixUnit = map[string]string{
	"seconds": "s",
	"bytes":   "By",
	"ratio":   "1",
	"gbps":    "GBy/s",
	"tokens":  "{token}",
	"blocks":  "{block}",
}

// PromUnit returns the unit word exposed as the OpenMetrics UNIT ("seconds", "bytes", "ratio",
// "gbps", "tokens", "blocks"), or "" when the name carries no unit suffix. The word is always
// a suffix of the name (before _total), as OpenMetrics requires.
func (in *Instrument) PromUnit() string {
	stem := strings.TrimSuffix(in.Name, "_total")
	for word, unit := range suffixUnit {
		if unit == in.Unit && strings.HasSuffix(stem, "_"+word) {
			return word
		}
	}
	return ""
}

// InstrumentSet is a validated instruments.yaml.
type InstrumentSet struct {
	// Version is the contract format version.
	Version int `yaml:"version"`
	// Instruments in file order.
	Instruments []Instrument `yaml:"instruments"`

	index map[string]int
}

// Lookup returns the instrument named name. The result points into the set; treat it as
// read-only.
func (s *InstrumentSet) Lookup(name string) (*Instrument, bool) {
	i, ok := s.index[name]
	if !ok {
		return nil, false
	}
	return &s.Instruments[i], true
}

// Names returns every instrument name in file order.
func (s *InstrumentSet) Names() []string {
	names := make([]string, len(s.Instruments))
	for i := range s.Instruments {
		names[i] = s.Instruments[i].Name
	}
	return names
}

// Owned returns the instruments the facade named owner registers, in file order.
func (s *InstrumentSet) Owned(owner string) []*Instrument {
	var out []*Instrument
	for i := range s.Instruments {
		if s.Instruments[i].OwnedBy(owner) {
			out = append(out, &s.Instruments[i])
		}
	}
	return out
}

// Instruments parses and validates the embedded instruments.yaml. Each call returns a new set.
func Instruments() (*InstrumentSet, error) {
	return ParseInstruments(instrumentsYAML)
}

// ParseInstruments parses and validates an instruments file. Errors wrap [ErrInvalid] and list
// every violation: unknown fields, names that break Prometheus conventions (counters end in
// _total, nothing else does; unit suffix consistent with unit; reserved suffixes), duplicate
// names, invalid or duplicate label keys, labels without exactly one of allowed/capped,
// buckets that are not finite, positive and strictly increasing, buckets on non-histograms.
func ParseInstruments(data []byte) (*InstrumentSet, error) {
	var set InstrumentSet
	if err := decodeStrict(InstrumentsFile, data, &set); err != nil {
		return nil, err
	}
	p := &problems{file: InstrumentsFile}
	if set.Version != 1 {
		p.addf("version %d unsupported (want 1)", set.Version)
	}
	if len(set.Instruments) == 0 {
		p.addf("no instruments")
	}
	set.index = make(map[string]int, len(set.Instruments))
	for i := range set.Instruments {
		in := &set.Instruments[i]
		validateInstrument(p, in)
		if _, dup := set.index[in.Name]; dup {
			p.addf("%s: duplicate name", in.Name)
			continue
		}
		set.index[in.Name] = i
	}
	// A name equal to another histogram's derived series would collide in the exposition.
	for i := range set.Instruments {
		in := &set.Instruments[i]
		if in.Type != Histogram {
			continue
		}
		for _, sfx := range []string{"_bucket", "_count", "_sum"} {
			if _, ok := set.index[in.Name+sfx]; ok {
				p.addf("%s: collides with the series of histogram %s", in.Name+sfx, in.Name)
			}
		}
	}
	if err := p.err(); err != nil {
		return nil, err
	}
	return &set, nil
}

var (
	metricNameRE = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
	labelKeyRE   = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)
	annotationRE = regexp.MustCompile(`^\{[a-z][a-z_]*\}$`)
	knownOwners  = []string{OwnerEngine, OwnerWorker, OwnerBlend, OwnerProcess, OwnerGateway}
)

func validateInstrument(p *problems, in *Instrument) {
	name := in.Name
	if name == "" {
		p.addf("instrument with empty name")
		name = "<unnamed>"
	} else if !metricNameRE.MatchString(name) || strings.Contains(name, "__") || strings.HasSuffix(name, "_") {
		p.addf("%s: name must be snake_case [a-z][a-z0-9_]* without __ or a trailing _", name)
	}
	for _, sfx := range []string{"_count", "_sum", "_bucket", "_created", "_gcount", "_gsum"} {
		if strings.HasSuffix(name, sfx) {
			p.addf("%s: suffix %s is reserved", name, sfx)
		}
	}
	switch in.Type {
	case Counter:
		if !strings.HasSuffix(name, "_total") {
			p.addf("%s: counter names must end in _total", name)
		}
	case Gauge, Histogram:
		if strings.HasSuffix(name, "_total") {
			p.addf("%s: only counter names may end in _total", name)
		}
	default:
		p.addf("%s: type %q is not counter, gauge or histogram", name, in.Type)
	}
	if strings.HasSuffix(name, "_info") && in.Type != Gauge {
		p.addf("%s: _info names are reserved for gauges", name)
	}
	if strings.TrimSpace(in.Help) == "" {
		p.addf("%s: empty help", name)
	} else if in.Help != strings.TrimSpace(in.Help) || strings.ContainsAny(in.Help, "\n\r") || !utf8.ValidString(in.Help) {
		p.addf("%s: help must be one line of UTF-8 without surrounding space", name)
	}
	validateUnit(p, in)
	if len(in.Owners) == 0 {
		p.addf("%s: no owners", name)
	}
	for i, o := range in.Owners {
		if !slices.Contains(knownOwners, o) {
			p.addf("%s: owner %q is not one of %v", name, o, knownOwners)
		}
		if slices.Contains(in.Owners[:i], o) {
			p.addf("%s: owner %q listed twice", name, o)
		}
	}
	if in.Exemplars && in.Type != Histogram {
		p.addf("%s: exemplars are only declared on histograms", name)
	}
	validateLabels(p, in)
	validateBuckets(p, in)
}

func validateUnit(p *problems, in *Instrument) {
	name := in.Name
	if _, ok := unitSuffix[in.Unit]; !ok && !annotationRE.MatchString(in.Unit) {
		p.addf("%s: unit %q is not s, By, 1, GBy/s or a {annotation}", name, in.Unit)
		return
	}
	stem := strings.TrimSuffix(name, "_total")
	if want, ok := unitSuffix[in.Unit]; ok && !strings.HasSuffix(stem, "_"+want) {
		p.addf("%s: unit %s requires the name suffix _%s", name, in.Unit, want)
	}
	for word, unit := range suffixUnit {
		if strings.HasSuffix(stem, "_"+word) && in.Unit != unit {
			p.addf("%s: the suffix _%s requires unit %s, not %q", name, word, unit, in.Unit)
		}
	}
}

func validateLabels(p *problems, in *Instrument) {
	name := in.Name
	if len(in.Labels) > MaxLabels {
		p.addf("%s: %d labels, at most %d allowed", name, len(in.Labels), MaxLabels)
	}
	seen := make(map[string]bool, len(in.Labels))
	for _, l := range in.Labels {
		switch {
		case !labelKeyRE.MatchString(l.Key):
			p.addf("%s: label key %q must match [a-z_][a-z0-9_]*", name, l.Key)
		case strings.HasPrefix(l.Key, "__"):
			p.addf("%s: label key %q: the __ prefix is reserved", name, l.Key)
		case l.Key == "le" || l.Key == "quantile":
			p.addf("%s: label key %q is reserved", name, l.Key)
		}
		if seen[l.Key] {
			p.addf("%s: label key %q listed twice", name, l.Key)
		}
		seen[l.Key] = true
		switch {
		case l.Capped && len(l.Allowed) > 0:
			p.addf("%s: label %q has both allowed values and capped", name, l.Key)
		case !l.Capped && len(l.Allowed) == 0:
			p.addf("%s: label %q needs an allowed list or capped: true", name, l.Key)
		}
		for i, v := range l.Allowed {
			if !utf8.ValidString(v) {
				p.addf("%s: label %q: allowed value %q is not UTF-8", name, l.Key, v)
			}
			if v == OtherValue {
				p.addf("%s: label %q: %q is reserved for capped labels", name, l.Key, v)
			}
			if slices.Contains(l.Allowed[:i], v) {
				p.addf("%s: label %q: allowed value %q listed twice", name, l.Key, v)
			}
		}
	}
}

func validateBuckets(p *problems, in *Instrument) {
	name := in.Name
	if in.Type != Histogram {
		if len(in.Buckets) > 0 {
			p.addf("%s: buckets on a %s", name, in.Type)
		}
		return
	}
	if len(in.Buckets) == 0 {
		p.addf("%s: histogram without buckets", name)
	}
	for i, b := range in.Buckets {
		if math.IsNaN(b) || math.IsInf(b, 0) {
			p.addf("%s: bucket %d is %v; bounds must be finite (+Inf is implicit)", name, i, b)
			continue
		}
		if b <= 0 {
			p.addf("%s: bucket %d is %v; bounds must be positive", name, i, b)
		}
		if i > 0 && !(b > in.Buckets[i-1]) {
			p.addf("%s: buckets not strictly increasing at %v after %v", name, b, in.Buckets[i-1])
		}
	}
}
