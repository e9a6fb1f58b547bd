package provider

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// OTLP protocols accepted in [Config.Protocol] and OTEL_EXPORTER_OTLP_*PROTOCOL.
const (
	ProtocolGRPC         = "grpc"
	ProtocolHTTPProtobuf = "http/protobuf"
	ProtocolHTTPJSON     = "http/json"
)

// Sampler names accepted in [Config.Sampler] and OTEL_TRACES_SAMPLER.
const (
	SamplerAlwaysOn                = "always_on"
	SamplerAlwaysOff               = "always_off"
	SamplerTraceIDRatio            = "traceidratio"
	SamplerParentBasedAlwaysOn     = "parentbased_always_on"
	SamplerParentBasedAlwaysOff    = "parentbased_always_off"
	SamplerParentBasedTraceIDRatio = "parentbased_traceidratio"
)

// Defaults applied by [New] to zero fields of [Config].
const (
	DefaultProtocol           = ProtocolHTTPProtobuf
	DefaultSampler            = SamplerParentBasedAlwaysOn
	DefaultExportTimeout      = 10 * time.Second
	DefaultMaxQueueSize       = 2048
	DefaultMaxExportBatchSize = 512
	DefaultBatchTimeout       = 5 * time.Second
)

// ErrConfig is wrapped by every error about a bad configuration value.
var ErrConfig = errors.New("telemetry config")

// Config holds the settings of a [Provider]. The zero value is valid: tracing
// off, profiling off. Fields left zero take the documented defaults in [New].
type Config struct {
	// ServiceName is the resource's service.name (cb-engine, cb-worker,
	// cb-blend). Default: service.name from ResourceAttributes, else
	// "unknown_service:<executable>".
	ServiceName string
	// ServiceVersion is service.version; omitted when empty unless
	// ResourceAttributes has one.
	ServiceVersion string
	// InstanceID is service.instance.id. Default: service.instance.id from
	// ResourceAttributes, else a random UUID (v4) per Provider.
	InstanceID string
	// ResourceAttributes are extra resource attributes
	// (OTEL_RESOURCE_ATTRIBUTES). The fields above win over them.
	ResourceAttributes []attribute.KeyValue

	// Endpoint is the full URL of the OTLP traces endpoint (scheme http or
	// https). For the HTTP protocols it is used as-is, so it includes the
	// path (normally /v1/traces); for grpc the path is ignored. An http://
	// URL means no TLS. Empty: no OTLP exporter.
	Endpoint string
	// Protocol is grpc, http/protobuf or http/json. Default http/protobuf.
	Protocol string

	// Sampler is the head sampler (OTEL_TRACES_SAMPLER names). Default
	// parentbased_always_on.
	Sampler string
	// SamplerArg is the ratio in [0, 1] of the traceidratio samplers
	// (OTEL_TRACES_SAMPLER_ARG). Default 1. Ignored by other samplers.
	SamplerArg string

	// Disabled turns tracing off whatever else is set (OTEL_SDK_DISABLED).
	Disabled bool
	// Enabled turns tracing on even without an Endpoint (CB_TRACING=1):
	// spans are recorded and handed to the span processors and exporters
	// passed as options. Without it, tracing is on only when Endpoint is set.
	Enabled bool

	// ExportTimeout bounds one export (and its retries) to the collector.
	// Default 10 s.
	ExportTimeout time.Duration
	// MaxQueueSize bounds the spans waiting for export; spans ended while it
	// is full are dropped and counted. Default 2048.
	MaxQueueSize int
	// MaxExportBatchSize is the largest batch sent in one export. Default 512
	// (capped at MaxQueueSize).
	MaxExportBatchSize int
	// BatchTimeout is the longest a span waits before its batch is sent.
	// Default 5 s.
	BatchTimeout time.Duration

	// Profile turns on the JSONL span profile (CB_PROFILE=1).
	Profile bool
	// ProfilePath is the profile file (CB_PROFILE_FILE). Default
	// cb-profile-<service>-<pid>.jsonl in the working directory.
	ProfilePath string
}

// TracingEnabled reports whether c turns tracing on: not Disabled, and an
// Endpoint or Enabled.
func (c Config) TracingEnabled() bool {
	return !c.Disabled && (c.Endpoint != "" || c.Enabled)
}

// ConfigFromEnv builds a Config from environment variables read with getenv
// (os.Getenv when nil):
//
//	OTEL_SERVICE_NAME                     ServiceName (wins over service.name in OTEL_RESOURCE_ATTRIBUTES)
//	OTEL_RESOURCE_ATTRIBUTES              ResourceAttributes: key=value,... with %-encoded values
//	OTEL_EXPORTER_OTLP_TRACES_ENDPOINT    Endpoint, used as-is
//	OTEL_EXPORTER_OTLP_ENDPOINT           Endpoint base: /v1/traces is appended for the HTTP protocols
//	OTEL_EXPORTER_OTLP_TRACES_PROTOCOL    Protocol (wins over the next)
//	OTEL_EXPORTER_OTLP_PROTOCOL           Protocol: grpc, http/protobuf (default), http/json
//	OTEL_EXPORTER_OTLP_TRACES_TIMEOUT     ExportTimeout in ms (wins over the next)
//	OTEL_EXPORTER_OTLP_TIMEOUT            ExportTimeout in ms (default 10000)
//	OTEL_TRACES_SAMPLER, _ARG             Sampler, SamplerArg
//	OTEL_BSP_MAX_QUEUE_SIZE               MaxQueueSize
//	OTEL_BSP_MAX_EXPORT_BATCH_SIZE        MaxExportBatchSize
//	OTEL_BSP_SCHEDULE_DELAY               BatchTimeout in ms
//	OTEL_SDK_DISABLED                     Disabled ("true" turns everything off; the Go SDK ignores it, we do not)
//	CB_TRACING                            Enabled (1/true, 0/false)
//	CB_PROFILE                            Profile (1/true, 0/false)
//	CB_PROFILE_FILE                       ProfilePath
//
// Unset variables leave the defaults. A malformed value is an error wrapping
// [ErrConfig] that names the variable. It is safe for concurrent use.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	r := &envReader{getenv: getenv}
	var c Config
	readEnv(r, &c.ResourceAttributes, parseResourceAttributes, "OTEL_RESOURCE_ATTRIBUTES")
	c.ServiceName = r.get("OTEL_SERVICE_NAME")
	if c.ServiceName == "" {
		c.ServiceName = attrValue(c.ResourceAttributes, "service.name")
	}

	// Protocol first: it decides how the generic endpoint is completed.
	c.Protocol = DefaultProtocol
	readEnv(r, &c.Protocol, func(v string) (string, error) { return v, validateProtocol(v) },
		"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
	if r.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" {
		readEnv(r, &c.Endpoint, func(v string) (string, error) { return v, validateEndpoint(v) }, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	} else {
		readEnv(r, &c.Endpoint, func(v string) (string, error) { return signalEndpoint(v, c.Protocol), validateEndpoint(v) },
			"OTEL_EXPORTER_OTLP_ENDPOINT")
	}
	readEnv(r, &c.ExportTimeout, parseMillis, "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT")

	if v := r.get("OTEL_TRACES_SAMPLER"); v != "" {
		c.Sampler = v
	}
	c.SamplerArg = r.get("OTEL_TRACES_SAMPLER_ARG")
	if _, err := c.sampler(); err != nil {
		r.fail("OTEL_TRACES_SAMPLER(_ARG)", c.Sampler+" "+c.SamplerArg, err)
	}

	readEnv(r, &c.MaxQueueSize, parsePositiveInt, "OTEL_BSP_MAX_QUEUE_SIZE")
	readEnv(r, &c.MaxExportBatchSize, parsePositiveInt, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE")
	readEnv(r, &c.BatchTimeout, parseMillis, "OTEL_BSP_SCHEDULE_DELAY")
	readEnv(r, &c.Disabled, boolParser(false), "OTEL_SDK_DISABLED")
	readEnv(r, &c.Enabled, boolParser(true), "CB_TRACING")
	readEnv(r, &c.Profile, boolParser(true), "CB_PROFILE")
	c.ProfilePath = r.get("CB_PROFILE_FILE")

	if len(r.errs) > 0 {
		return Config{}, errors.Join(r.errs...)
	}
	return c, nil
}

// envReader reads the environment for ConfigFromEnv, collecting the errors of malformed
// values.
type envReader struct {
	getenv func(string) string
	errs   []error
}

// get returns the variable k, trimmed.
func (r *envReader) get(k string) string { return strings.TrimSpace(r.getenv(k)) }

// fail records that the variable name has the malformed value val.
func (r *envReader) fail(name, val string, err error) {
	r.errs = append(r.errs, fmt.Errorf("%w: %s=%q: %w", ErrConfig, name, val, err))
}

// readEnv parses the first of keys that is set into *dst; a malformed value is recorded and
// leaves *dst as it was.
func readEnv[T any](r *envReader, dst *T, parse func(string) (T, error), keys ...string) {
	for _, k := range keys {
		if v := r.get(k); v != "" {
			x, err := parse(v)
			if err != nil {
				r.fail(k, v, err)
				return
			}
			*dst = x
			return
		}
	}
}

// validate checks the fields New relies on.
func (c Config) validate() error {
	var errs []error
	if c.Protocol != "" {
		if err := validateProtocol(c.Protocol); err != nil {
			errs = append(errs, fmt.Errorf("%w: Protocol: %w", ErrConfig, err))
		}
	}
	if c.Endpoint != "" {
		if err := validateEndpoint(c.Endpoint); err != nil {
			errs = append(errs, fmt.Errorf("%w: Endpoint: %w", ErrConfig, err))
		}
	}
	if _, err := c.sampler(); err != nil {
		errs = append(errs, fmt.Errorf("%w: Sampler: %w", ErrConfig, err))
	}
	if c.ExportTimeout < 0 || c.BatchTimeout < 0 || c.MaxQueueSize < 0 || c.MaxExportBatchSize < 0 {
		errs = append(errs, fmt.Errorf("%w: negative timeout or queue size", ErrConfig))
	}
	return errors.Join(errs...)
}

// withDefaults returns c with zero fields set to their defaults.
func (c Config) withDefaults() Config {
	if c.Protocol == "" {
		c.Protocol = DefaultProtocol
	}
	if c.Sampler == "" {
		c.Sampler = DefaultSampler
	}
	if c.ExportTimeout == 0 {
		c.ExportTimeout = DefaultExportTimeout
	}
	if c.MaxQueueSize == 0 {
		c.MaxQueueSize = DefaultMaxQueueSize
	}
	if c.MaxExportBatchSize == 0 {
		c.MaxExportBatchSize = DefaultMaxExportBatchSize
	}
	c.MaxExportBatchSize = min(c.MaxExportBatchSize, c.MaxQueueSize)
	if c.BatchTimeout == 0 {
		c.BatchTimeout = DefaultBatchTimeout
	}
	return c
}

// sampler builds the SDK sampler named by c.Sampler and c.SamplerArg.
func (c Config) sampler() (sdktrace.Sampler, error) {
	ratio := func() (float64, error) {
		if c.SamplerArg == "" {
			return 1, nil
		}
		r, err := strconv.ParseFloat(c.SamplerArg, 64)
		if err != nil || r < 0 || r > 1 || r != r {
			return 0, fmt.Errorf("sampler argument %q is not a ratio in [0, 1]", c.SamplerArg)
		}
		return r, nil
	}
	switch name := c.Sampler; name {
	case "", SamplerParentBasedAlwaysOn:
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), nil
	case SamplerAlwaysOn:
		return sdktrace.AlwaysSample(), nil
	case SamplerAlwaysOff:
		return sdktrace.NeverSample(), nil
	case SamplerParentBasedAlwaysOff:
		return sdktrace.ParentBased(sdktrace.NeverSample()), nil
	case SamplerTraceIDRatio, SamplerParentBasedTraceIDRatio:
		r, err := ratio()
		if err != nil {
			return nil, err
		}
		if name == SamplerTraceIDRatio {
			return sdktrace.TraceIDRatioBased(r), nil
		}
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(r)), nil
	default:
		return nil, fmt.Errorf("unsupported sampler %q (want always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off or parentbased_traceidratio)", name)
	}
}

func validateProtocol(p string) error {
	switch p {
	case ProtocolGRPC, ProtocolHTTPProtobuf, ProtocolHTTPJSON:
		return nil
	}
	return fmt.Errorf("unsupported protocol %q (want grpc, http/protobuf or http/json)", p)
}

func validateEndpoint(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("endpoint is not a URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("endpoint %q needs scheme http:// or https://", s)
	}
	if u.Host == "" {
		return fmt.Errorf("endpoint %q has no host", s)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("endpoint %q must not have a query or fragment", s)
	}
	return nil
}

// signalEndpoint completes the generic OTEL_EXPORTER_OTLP_ENDPOINT for
// traces: the HTTP protocols append /v1/traces to its path, gRPC uses it
// as-is (OTLP exporter specification, "Endpoint URLs for OTLP/HTTP").
func signalEndpoint(base, protocol string) string {
	if protocol == ProtocolGRPC {
		return base
	}
	u, err := url.Parse(base)
	if err != nil {
		return base
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + "/v1/traces"
	u.RawPath = ""
	return u.String()
}

func parseMillis(v string) (time.Duration, error) {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 || n > int64(time.Duration(1<<62)/time.Millisecond) {
		return 0, errors.New("want a positive integer number of milliseconds")
	}
	return time.Duration(n) * time.Millisecond, nil
}

func parsePositiveInt(v string) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		return 0, errors.New("want a positive integer")
	}
	return n, nil
}

// boolParser returns a parser of true/false (any case) and, when digits is set, 1/0.
func boolParser(digits bool) func(string) (bool, error) {
	return func(v string) (bool, error) {
		switch strings.ToLower(v) {
		case "true":
			return true, nil
		case "false":
			return false, nil
		}
		if !digits {
			return false, errors.New("want true or false")
		}
		switch v {
		case "1":
			return true, nil
		case "0":
			return false, nil
		}
		return false, errors.New("want 1, 0, true or false")
	}
}

// parseResourceAttributes parses OTEL_RESOURCE_ATTRIBUTES: comma-separated
// key=value pairs, keys and values trimmed, values %-decoded.
func parseResourceAttributes(s string) ([]attribute.KeyValue, error) {
	var attrs []attribute.KeyValue
	for p := range strings.SplitSeq(s, ",") {
		k, v, ok := strings.Cut(p, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("pair %q is not key=value", p)
		}
		val, err := url.PathUnescape(strings.TrimSpace(v))
		if err != nil {
			return nil, fmt.Errorf("value of %q is badly %%-encoded: %w", k, err)
		}
		attrs = append(attrs, attribute.String(k, val))
	}
	return attrs, nil
}

func attrValue(attrs []attribute.KeyValue, key attribute.Key) string {
	for i := len(attrs) - 1; i >= 0; i-- {
		if attrs[i].Key == key {
			return attrs[i].Value.Emit()
		}
	}
	return ""
}
