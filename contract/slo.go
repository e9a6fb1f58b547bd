package contract

import (
	"math"
	"regexp"
	"slices"
	"time"

	"github.com/prometheus/common/model"
)

// ObjectiveKind says how an objective's SLI is computed.
type ObjectiveKind string

// The objective kinds.
const (
	// Latency: the fraction of a histogram's observations at most Threshold seconds.
	Latency ObjectiveKind = "latency"
	// Availability: one minus the fraction of a histogram's events matching Bad.
	Availability ObjectiveKind = "availability"
)

// Matcher is a PromQL label matcher; regex values are fully anchored, as in PromQL.
type Matcher struct {
	// Label is the label key.
	Label string `yaml:"label"`
	// Op is =, !=, =~ or !~.
	Op string `yaml:"op"`
	// Value is the literal or regular expression.
	Value string `yaml:"value"`
}

// Objective is one service-level objective.
type Objective struct {
	// Name identifies the objective (snake_case).
	Name string
	// Description is one sentence for humans.
	Description string
	// Runbook, when set, is the first look an alert of the objective suggests
	// (default: one per Kind).
	Runbook string
	// Kind is Latency or Availability.
	Kind ObjectiveKind
	// Metric is a histogram of instruments.yaml.
	Metric string
	// Threshold is the latency bound in seconds (Latency only); a bucket bound of Metric.
	Threshold float64
	// Target is the fraction of good events, 0 < Target < 1.
	Target float64
	// Selector restricts numerator and denominator.
	Selector []Matcher
	// Bad selects the bad events (Availability only), in addition to Selector.
	Bad []Matcher
}

// ErrorBudget returns 1 - Target.
func (o *Objective) ErrorBudget() float64 { return 1 - o.Target }

// BurnRateAlert is one multi-window burn-rate alert applied to every objective: it fires when
// the error ratio exceeds Factor × ErrorBudget over both LongWindow and ShortWindow.
type BurnRateAlert struct {
	// Severity is a routing label such as "page" or "ticket".
	Severity string
	// LongWindow and ShortWindow are the two rate windows; ShortWindow < LongWindow.
	LongWindow, ShortWindow time.Duration
	// LongWindowText and ShortWindowText are the windows as written (PromQL durations).
	LongWindowText, ShortWindowText string
	// Factor is the burn rate: how many times faster than sustainable the budget is spent.
	Factor float64
}

// SLOSet is a validated slo.yaml.
type SLOSet struct {
	// Version is the contract format version.
	Version int
	// Window is the SLO window (30 days).
	Window time.Duration
	// WindowText is the window as written, e.g. "30d".
	WindowText string
	// Objectives in file order.
	Objectives []Objective
	// BurnRateAlerts in file order.
	BurnRateAlerts []BurnRateAlert
}

// Lookup returns the objective named name.
func (s *SLOSet) Lookup(name string) (*Objective, bool) {
	for i := range s.Objectives {
		if s.Objectives[i].Name == name {
			return &s.Objectives[i], true
		}
	}
	return nil, false
}

type rawObjective struct {
	Name        string        `yaml:"name"`
	Description string        `yaml:"description"`
	Runbook     string        `yaml:"runbook"`
	Kind        ObjectiveKind `yaml:"kind"`
	Metric      string        `yaml:"metric"`
	Threshold   *float64      `yaml:"threshold"`
	Target      float64       `yaml:"target"`
	Selector    []Matcher     `yaml:"selector"`
	Bad         []Matcher     `yaml:"bad"`
}

type rawAlert struct {
	Severity    string  `yaml:"severity"`
	LongWindow  string  `yaml:"long_window"`
	ShortWindow string  `yaml:"short_window"`
	Factor      float64 `yaml:"factor"`
}

type rawSLO struct {
	Version        int            `yaml:"version"`
	Window         string         `yaml:"window"`
	Objectives     []rawObjective `yaml:"objectives"`
	BurnRateAlerts []rawAlert     `yaml:"burn_rate_alerts"`
}

// SLOs parses and validates the embedded slo.yaml, checked against the embedded
// instruments.yaml. Each call returns a new set.
func SLOs() (*SLOSet, error) {
	inst, err := Instruments()
	if err != nil {
		return nil, err
	}
	return ParseSLOs(sloYAML, inst)
}

var (
	objectiveNameRE = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
	severityRE      = regexp.MustCompile(`^[a-z][a-z_]*$`)
	matcherOps      = []string{"=", "!=", "=~", "!~"}
)

// ParseSLOs parses and validates an SLO file. When inst is non-nil every objective is checked
// against it: the metric exists and is a histogram, a latency threshold is exactly one of its
// bucket bounds, matcher labels are among its label keys (and an "=" on a label with an
// allowed list names an allowed value). Errors wrap [ErrInvalid].
func ParseSLOs(data []byte, inst *InstrumentSet) (*SLOSet, error) {
	var raw rawSLO
	if err := decodeStrict(SLOFile, data, &raw); err != nil {
		return nil, err
	}
	p := &problems{file: SLOFile}
	set := &SLOSet{Version: raw.Version, WindowText: raw.Window}
	if raw.Version != 1 {
		p.addf("version %d unsupported (want 1)", raw.Version)
	}
	if w, err := model.ParseDuration(raw.Window); err != nil || w <= 0 {
		p.addf("window %q is not a positive duration", raw.Window)
	} else {
		set.Window = time.Duration(w)
	}
	if len(raw.Objectives) == 0 {
		p.addf("no objectives")
	}
	for i, ro := range raw.Objectives {
		o := Objective{
			Name: ro.Name, Description: ro.Description, Runbook: ro.Runbook, Kind: ro.Kind, Metric: ro.Metric,
			Target: ro.Target, Selector: ro.Selector, Bad: ro.Bad,
		}
		if ro.Threshold != nil {
			o.Threshold = *ro.Threshold
		}
		validateObjective(p, &o, ro.Threshold != nil, inst)
		for _, prev := range raw.Objectives[:i] {
			if prev.Name == ro.Name {
				p.addf("objective %q listed twice", ro.Name)
			}
		}
		set.Objectives = append(set.Objectives, o)
	}
	for _, ra := range raw.BurnRateAlerts {
		a := BurnRateAlert{Severity: ra.Severity, Factor: ra.Factor, LongWindowText: ra.LongWindow, ShortWindowText: ra.ShortWindow}
		validateAlert(p, set, &a)
		set.BurnRateAlerts = append(set.BurnRateAlerts, a)
	}
	if err := p.err(); err != nil {
		return nil, err
	}
	return set, nil
}

func validateObjective(p *problems, o *Objective, hasThreshold bool, inst *InstrumentSet) {
	name := o.Name
	if !objectiveNameRE.MatchString(name) {
		p.addf("objective %q: name must match [a-z][a-z0-9_]*", name)
	}
	if o.Description == "" {
		p.addf("%s: empty description", name)
	}
	if !(o.Target > 0 && o.Target < 1) {
		p.addf("%s: target %v must be in (0, 1)", name, o.Target)
	}
	switch o.Kind {
	case Latency:
		if !hasThreshold || !(o.Threshold > 0) || math.IsInf(o.Threshold, 0) {
			p.addf("%s: a latency objective needs a positive finite threshold", name)
		}
		if len(o.Bad) > 0 {
			p.addf("%s: a latency objective takes no bad matchers", name)
		}
	case Availability:
		if hasThreshold {
			p.addf("%s: an availability objective takes no threshold", name)
		}
		if len(o.Bad) == 0 {
			p.addf("%s: an availability objective needs bad matchers", name)
		}
	default:
		p.addf("%s: kind %q is not latency or availability", name, o.Kind)
	}
	var in *Instrument
	if inst != nil {
		var ok bool
		if in, ok = inst.Lookup(o.Metric); !ok {
			p.addf("%s: metric %q is not in %s", name, o.Metric, InstrumentsFile)
		} else if in.Type != Histogram {
			p.addf("%s: metric %q is a %s, not a histogram", name, o.Metric, in.Type)
			in = nil
		} else if o.Kind == Latency && hasThreshold && !in.HasBound(o.Threshold) {
			p.addf("%s: threshold %v is not a bucket bound of %s %v", name, o.Threshold, o.Metric, in.Buckets)
		}
	} else if !metricNameRE.MatchString(o.Metric) {
		p.addf("%s: metric %q is not a metric name", name, o.Metric)
	}
	for _, m := range slices.Concat(o.Selector, o.Bad) {
		validateMatcher(p, name, m, in)
	}
}

func validateMatcher(p *problems, objective string, m Matcher, in *Instrument) {
	if !slices.Contains(matcherOps, m.Op) {
		p.addf("%s: matcher op %q is not one of %v", objective, m.Op, matcherOps)
	}
	if m.Label == "le" || !labelKeyRE.MatchString(m.Label) {
		p.addf("%s: matcher label %q invalid", objective, m.Label)
	}
	if m.Op == "=~" || m.Op == "!~" {
		if _, err := regexp.Compile("^(?:" + m.Value + ")$"); err != nil {
			p.addf("%s: matcher %s%s%q: %v", objective, m.Label, m.Op, m.Value, err)
		}
	}
	if in == nil {
		return
	}
	l, ok := in.Label(m.Label)
	if !ok {
		p.addf("%s: label %q is not a label of %s", objective, m.Label, in.Name)
		return
	}
	if m.Op == "=" && !l.Capped && !l.Allows(m.Value) {
		p.addf("%s: %s=%q is not an allowed value", objective, m.Label, m.Value)
	}
}

func validateAlert(p *problems, set *SLOSet, a *BurnRateAlert) {
	if !severityRE.MatchString(a.Severity) {
		p.addf("burn-rate alert: severity %q invalid", a.Severity)
	}
	long, errL := model.ParseDuration(a.LongWindowText)
	short, errS := model.ParseDuration(a.ShortWindowText)
	if errL != nil || errS != nil || long <= 0 || short <= 0 {
		p.addf("burn-rate alert %s/%s: windows must be positive durations", a.LongWindowText, a.ShortWindowText)
		return
	}
	a.LongWindow, a.ShortWindow = time.Duration(long), time.Duration(short)
	if a.ShortWindow >= a.LongWindow {
		p.addf("burn-rate alert %s/%s: the short window must be shorter than the long one", a.LongWindowText, a.ShortWindowText)
	}
	if set.Window > 0 && a.LongWindow > set.Window {
		p.addf("burn-rate alert %s: the long window exceeds the SLO window %s", a.LongWindowText, set.WindowText)
	}
	if !(a.Factor > 0) || math.IsInf(a.Factor, 0) {
		p.addf("burn-rate alert %s: factor %v must be positive and finite", a.LongWindowText, a.Factor)
		return
	}
	for _, o := range set.Objectives {
		if o.Target > 0 && o.Target < 1 && a.Factor*o.ErrorBudget() > 1 {
			p.addf("burn-rate alert %s: factor %v × budget %v of %s exceeds 1, so it can never fire",
				a.LongWindowText, a.Factor, o.ErrorBudget(), o.Name)
		}
	}
}
