package provider

import (
	"errors"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
)

func envMap(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestConfigFromEnv(t *testing.T) {
	tests := []struct {
		name  string
		env   map[string]string
		check func(t *testing.T, c Config)
	}{
		{"empty: tracing off, defaults", nil, func(t *testing.T, c Config) {
			if c.TracingEnabled() || c.Endpoint != "" || c.Protocol != ProtocolHTTPProtobuf || c.Profile {
				t.Fatalf("%+v", c)
			}
		}},
		{"generic endpoint gets /v1/traces for http", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, func(t *testing.T, c Config) {
			if c.Endpoint != "http://collector:4318/v1/traces" || !c.TracingEnabled() {
				t.Fatalf("%+v", c)
			}
		}},
		{"generic endpoint with path and slash", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://h/otlp/", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, func(t *testing.T, c Config) {
			if c.Endpoint != "https://h/otlp/v1/traces" || c.Protocol != ProtocolHTTPJSON {
				t.Fatalf("%+v", c)
			}
		}},
		{"generic endpoint as-is for grpc", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, func(t *testing.T, c Config) {
			if c.Endpoint != "http://collector:4317" || c.Protocol != ProtocolGRPC {
				t.Fatalf("%+v", c)
			}
		}},
		{"traces endpoint wins and is used as-is", map[string]string{
			"OTEL_EXPORTER_OTLP_ENDPOINT":        "http://generic:4318",
			"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://traces:4318/custom",
		}, func(t *testing.T, c Config) {
			if c.Endpoint != "http://traces:4318/custom" {
				t.Fatalf("%+v", c)
			}
		}},
		{"traces protocol wins", map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"}, func(t *testing.T, c Config) {
			if c.Protocol != ProtocolHTTPJSON {
				t.Fatalf("%+v", c)
			}
		}},
		{"timeouts in ms, traces wins", map[string]string{"OTEL_EXPORTER_OTLP_TIMEOUT": "5000", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "250"}, func(t *testing.T, c Config) {
			if c.ExportTimeout != 250*time.Millisecond {
				t.Fatalf("%+v", c)
			}
		}},
		{"service name and resource attributes", map[string]string{
			"OTEL_SERVICE_NAME":        "cb-engine",
			"OTEL_RESOURCE_ATTRIBUTES": "service.name=ignored, deployment.environment=dev ,team=a%20b",
		}, func(t *testing.T, c Config) {
			if c.ServiceName != "cb-engine" {
				t.Fatalf("service %q", c.ServiceName)
			}
			want := []attribute.KeyValue{attribute.String("service.name", "ignored"), attribute.String("deployment.environment", "dev"), attribute.String("team", "a b")}
			if len(c.ResourceAttributes) != len(want) {
				t.Fatalf("%v", c.ResourceAttributes)
			}
			for i := range want {
				if c.ResourceAttributes[i] != want[i] {
					t.Fatalf("%v", c.ResourceAttributes)
				}
			}
		}},
		{"service name from resource attributes", map[string]string{"OTEL_RESOURCE_ATTRIBUTES": "service.name=cb-blend"}, func(t *testing.T, c Config) {
			if c.ServiceName != "cb-blend" {
				t.Fatalf("%+v", c)
			}
		}},
		{"sampler and ratio", map[string]string{"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"}, func(t *testing.T, c Config) {
			if c.Sampler != SamplerParentBasedTraceIDRatio || c.SamplerArg != "0.25" {
				t.Fatalf("%+v", c)
			}
		}},
		{"sdk disabled wins over endpoint and CB_TRACING", map[string]string{"OTEL_SDK_DISABLED": "TRUE", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "CB_TRACING": "1"}, func(t *testing.T, c Config) {
			if !c.Disabled || c.TracingEnabled() {
				t.Fatalf("%+v", c)
			}
		}},
		{"CB_TRACING without endpoint", map[string]string{"CB_TRACING": "1"}, func(t *testing.T, c Config) {
			if !c.Enabled || !c.TracingEnabled() || c.Endpoint != "" {
				t.Fatalf("%+v", c)
			}
		}},
		{"CB_TRACING=0", map[string]string{"CB_TRACING": "0", "OTEL_SDK_DISABLED": "false"}, func(t *testing.T, c Config) {
			if c.TracingEnabled() {
				t.Fatalf("%+v", c)
			}
		}},
		{"profile", map[string]string{"CB_PROFILE": "1", "CB_PROFILE_FILE": "/tmp/p.jsonl"}, func(t *testing.T, c Config) {
			if !c.Profile || c.ProfilePath != "/tmp/p.jsonl" {
				t.Fatalf("%+v", c)
			}
		}},
		{"batch settings", map[string]string{"OTEL_BSP_MAX_QUEUE_SIZE": "100", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "10", "OTEL_BSP_SCHEDULE_DELAY": "50"}, func(t *testing.T, c Config) {
			if c.MaxQueueSize != 100 || c.MaxExportBatchSize != 10 || c.BatchTimeout != 50*time.Millisecond {
				t.Fatalf("%+v", c)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ConfigFromEnv(envMap(tc.env))
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, c)
		})
	}
}

func TestConfigFromEnvErrors(t *testing.T) {
	tests := []struct {
		name, key, value string
	}{
		{"unknown protocol", "OTEL_EXPORTER_OTLP_PROTOCOL", "http"},
		{"unknown traces protocol", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "udp"},
		{"endpoint without scheme", "OTEL_EXPORTER_OTLP_ENDPOINT", "localhost:4318"},
		{"endpoint bad scheme", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "ftp://h/v1/traces"},
		{"endpoint with query", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://h/v1/traces?x=1"},
		{"endpoint without host", "OTEL_EXPORTER_OTLP_ENDPOINT", "http://"},
		{"timeout not a number", "OTEL_EXPORTER_OTLP_TIMEOUT", "10s"},
		{"timeout zero", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "0"},
		{"unknown sampler", "OTEL_TRACES_SAMPLER", "jaeger_remote"},
		{"sdk disabled not a bool", "OTEL_SDK_DISABLED", "yes"},
		{"CB_TRACING not a bool", "CB_TRACING", "on"},
		{"CB_PROFILE not a bool", "CB_PROFILE", "2"},
		{"resource attribute without value", "OTEL_RESOURCE_ATTRIBUTES", "a=b,c"},
		{"resource attribute bad escape", "OTEL_RESOURCE_ATTRIBUTES", "a=%zz"},
		{"queue size negative", "OTEL_BSP_MAX_QUEUE_SIZE", "-1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ConfigFromEnv(envMap(map[string]string{tc.key: tc.value}))
			if err == nil {
				t.Fatal("accepted")
			}
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.key) {
				t.Fatalf("error %q does not wrap ErrConfig or name %s", err, tc.key)
			}
		})
	}
	t.Run("bad sampler ratio", func(t *testing.T) {
		for _, arg := range []string{"1.5", "-0.1", "NaN", "half"} {
			_, err := ConfigFromEnv(envMap(map[string]string{"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": arg}))
			if !errors.Is(err, ErrConfig) {
				t.Fatalf("%s: %v", arg, err)
			}
		}
	})
}
