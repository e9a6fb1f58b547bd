package telemetry

import (
	"context"
	"errors"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

const (
	w3cExample = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	exTrace    = "4bf92f3577b34da6a3ce929d0e0e4736"
	exSpan     = "00f067aa0ba902b7"
)

type tpCase struct {
	name  string
	in    string
	valid bool
	flags trace.TraceFlags // expected flags when valid
	// sdkDiffers explains why the SDK's propagation.TraceContext decides
	// otherwise; empty when both agree.
	sdkDiffers string
}

var tpCases = []tpCase{
	{name: "w3c example sampled", in: w3cExample, valid: true, flags: trace.FlagsSampled},
	{name: "not sampled", in: "00-" + exTrace + "-" + exSpan + "-00", valid: true},
	{name: "random flag", in: "00-" + exTrace + "-" + exSpan + "-02", valid: true, flags: trace.FlagsRandom},
	{name: "sampled and random", in: "00-" + exTrace + "-" + exSpan + "-03", valid: true, flags: 3},
	{name: "v00 reserved flag bit masked", in: "00-" + exTrace + "-" + exSpan + "-09", valid: true, flags: trace.FlagsSampled,
		sdkDiffers: "the SDK rejects version 00 with flag bits above 0x03; W3C asks receivers to mask unknown flag bits (09 = sampled + 0x08)"},
	{name: "v00 all flag bits masked", in: "00-" + exTrace + "-" + exSpan + "-ff", valid: true, flags: 3,
		sdkDiffers: "as above: the SDK rejects reserved flag bits on version 00, we ignore them"},
	{name: "uppercase trace id", in: "00-4BF92F3577B34DA6A3CE929D0E0E4736-" + exSpan + "-01"},
	{name: "uppercase span id", in: "00-" + exTrace + "-00F067AA0BA902B7-01"},
	{name: "uppercase flags", in: "00-" + exTrace + "-" + exSpan + "-0A"},
	{name: "uppercase version", in: "0A-" + exTrace + "-" + exSpan + "-01"},
	{name: "version ff", in: "ff-" + exTrace + "-" + exSpan + "-01"},
	{name: "version 00 extra field", in: w3cExample + "-what-the-future-holds"},
	{name: "version 00 trailing dash", in: w3cExample + "-",
		sdkDiffers: "the SDK accepts a version 00 value ending in '-' (an empty fifth field); W3C says version 00 has exactly four fields"},
	{name: "version 00 trailing char", in: w3cExample + "0"},
	{name: "future version exact length", in: "01-" + exTrace + "-" + exSpan + "-01", valid: true, flags: trace.FlagsSampled},
	{name: "future version extra fields", in: "cc-" + exTrace + "-" + exSpan + "-01-what-the-future-holds", valid: true, flags: trace.FlagsSampled},
	{name: "future version trailing dash", in: "fe-" + exTrace + "-" + exSpan + "-00-", valid: true},
	{name: "future version flags not followed by dash", in: "01-" + exTrace + "-" + exSpan + "-01x"},
	{name: "future version three fields", in: "01-" + exTrace + "-" + exSpan},
	{name: "future version uppercase id", in: "01-4BF92F3577B34DA6A3CE929D0E0E4736-" + exSpan + "-01"},
	{name: "future version reserved flags masked", in: "02-" + exTrace + "-" + exSpan + "-09-x", valid: true, flags: trace.FlagsSampled},
	{name: "zero trace id", in: "00-00000000000000000000000000000000-" + exSpan + "-01"},
	{name: "zero span id", in: "00-" + exTrace + "-0000000000000000-01"},
	{name: "trace id 31 digits", in: "00-" + exTrace[:31] + "-" + exSpan + "-01"},
	{name: "trace id 33 digits", in: "00-" + exTrace + "0-" + exSpan + "-01"},
	{name: "span id 15 digits", in: "00-" + exTrace + "-" + exSpan[:15] + "-01"},
	{name: "fields shifted but total length 55", in: "00-" + exTrace + "a-" + exSpan[:15] + "-01"},
	{name: "flags one digit", in: "00-" + exTrace + "-" + exSpan + "-1"},
	{name: "flags three digits", in: "00-" + exTrace + "-" + exSpan + "-001"},
	{name: "empty", in: ""},
	{name: "leading space", in: " " + w3cExample},
	{name: "trailing space", in: w3cExample + " "},
	{name: "non-hex in trace id", in: "00-4bf92f3577b34da6a3ce929d0e0e473g-" + exSpan + "-01"},
	{name: "non-hex in span id", in: "00-" + exTrace + "-00f067aa0ba902bz-01"},
	{name: "non-hex version", in: "0x-" + exTrace + "-" + exSpan + "-01"},
	{name: "underscore separators", in: "00_" + exTrace + "_" + exSpan + "_01"},
	{name: "two headers joined by comma", in: w3cExample + "," + w3cExample},
	{name: "unicode digit", in: "00-4bf92f3577b34da6a3ce929d0e0e473٣-" + exSpan + "-01"},
}

func sdkExtract(s string) trace.SpanContext {
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": s})
	return trace.SpanContextFromContext(ctx)
}

func TestParseTraceparentTable(t *testing.T) {
	if len(tpCases) < 25 {
		t.Fatalf("only %d cases", len(tpCases))
	}
	for _, tc := range tpCases {
		t.Run(tc.name, func(t *testing.T) {
			sc, err := ParseTraceparent(tc.in)
			if tc.valid {
				if err != nil {
					t.Fatalf("ParseTraceparent(%q) = %v, want valid", tc.in, err)
				}
				if got := sc.TraceID().String(); got != exTrace {
					t.Errorf("trace id %s, want %s", got, exTrace)
				}
				if got := sc.SpanID().String(); got != exSpan {
					t.Errorf("span id %s, want %s", got, exSpan)
				}
				if sc.TraceFlags() != tc.flags {
					t.Errorf("flags %02x, want %02x", byte(sc.TraceFlags()), byte(tc.flags))
				}
				if !sc.IsRemote() {
					t.Error("span context not remote")
				}
			} else {
				if err == nil {
					t.Fatalf("ParseTraceparent(%q) accepted, want invalid", tc.in)
				}
				if !errors.Is(err, ErrInvalidTraceparent) {
					t.Errorf("error %v does not wrap ErrInvalidTraceparent", err)
				}
				if sc.IsValid() {
					t.Errorf("invalid input returned a valid span context %v", sc)
				}
			}

			// Cross-check with the SDK's propagator.
			sdk := sdkExtract(tc.in)
			sdkValid := sdk.IsValid()
			if tc.sdkDiffers != "" {
				if sdkValid == tc.valid {
					t.Fatalf("expected the SDK to differ (%s) but it agrees", tc.sdkDiffers)
				}
				t.Logf("differs from the SDK on purpose: %s", tc.sdkDiffers)
				return
			}
			if sdkValid != tc.valid {
				t.Fatalf("SDK valid=%v, ours %v", sdkValid, tc.valid)
			}
			if tc.valid && !sdk.Equal(sc) {
				t.Fatalf("SDK span context %v, ours %v", sdk, sc)
			}
		})
	}
}

// TestTraceparentHandExample is the seed's traceparent_hand_example: the W3C
// example parsed and written back unchanged.
func TestTraceparentHandExample(t *testing.T) {
	sc, err := ParseTraceparent(w3cExample)
	if err != nil {
		t.Fatal(err)
	}
	if sc.TraceID().String() != exTrace || sc.SpanID().String() != exSpan || !sc.IsSampled() {
		t.Fatalf("parsed %v", sc)
	}
	if got := FormatTraceparent(sc); got != w3cExample {
		t.Fatalf("written back as %q, want %q", got, w3cExample)
	}
	// Same bytes as the SDK's injector writes.
	mc := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(context.Background(), sc), mc)
	if mc.Get("traceparent") != w3cExample {
		t.Fatalf("SDK writes %q", mc.Get("traceparent"))
	}
}

func TestFormatTraceparent(t *testing.T) {
	tid, _ := trace.TraceIDFromHex(exTrace)
	sid, _ := trace.SpanIDFromHex(exSpan)
	tests := []struct {
		name  string
		sc    trace.SpanContext
		want  string
		flags trace.TraceFlags
	}{
		{"invalid span context", trace.SpanContext{}, "", 0},
		{"zero span id", trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid}), "", 0},
		{"unsampled two digit flags", trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid}), "00-" + exTrace + "-" + exSpan + "-00", 0},
		{"reserved flags not written", trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: 0xff}), "00-" + exTrace + "-" + exSpan + "-03", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := FormatTraceparent(tc.sc); got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func FuzzParseTraceparent(f *testing.F) {
	for _, tc := range tpCases {
		f.Add(tc.in)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sc, err := ParseTraceparent(s)
		sdk := sdkExtract(s)
		if err != nil {
			if sc.IsValid() {
				t.Fatalf("error %v with a valid span context", err)
			}
			// The only value the SDK accepts and we do not: version 00
			// followed by a lone '-'.
			if sdk.IsValid() && !(len(s) == 56 && s[:2] == "00" && s[55] == '-') {
				t.Fatalf("SDK accepts %q, we reject it: %v", s, err)
			}
			return
		}
		if !sc.IsValid() || !sc.IsRemote() {
			t.Fatalf("accepted %q as %v", s, sc)
		}
		if sdk.IsValid() {
			if !sdk.Equal(sc) {
				t.Fatalf("SDK parses %q as %v, we as %v", s, sdk, sc)
			}
		} else if !(s[:2] == "00" && unhex[s[53]]<<4|unhex[s[54]] > 3) {
			// The other documented difference: reserved flag bits on v00.
			t.Fatalf("we accept %q, the SDK rejects it", s)
		}
		out := FormatTraceparent(sc)
		if len(out) != 55 || out[:3] != "00-" || strings.ToLower(out) != out {
			t.Fatalf("formatted %q", out)
		}
		sc2, err := ParseTraceparent(out)
		if err != nil {
			t.Fatalf("round trip of %q via %q: %v", s, out, err)
		}
		if !sc2.Equal(sc) {
			t.Fatalf("round trip of %q: %v != %v", s, sc2, sc)
		}
		if FormatTraceparent(sc2) != out {
			t.Fatalf("second format differs")
		}
	})
}

func TestTraceIDFromRequestID(t *testing.T) {
	ids := map[trace.TraceID]string{}
	for _, rid := range []string{"", "req-1", "req-2", "chatcmpl-123", strings.Repeat("x", 10000)} {
		id := TraceIDFromRequestID(rid)
		if !id.IsValid() {
			t.Fatalf("%q: zero trace id", rid)
		}
		if again := TraceIDFromRequestID(rid); again != id {
			t.Fatalf("%q: not deterministic: %v vs %v", rid, id, again)
		}
		if other, dup := ids[id]; dup {
			t.Fatalf("%q and %q collide", rid, other)
		}
		ids[id] = rid
	}
	// Known value: first 16 bytes of SHA-256("abc").
	if got, want := TraceIDFromRequestID("abc").String(), "ba7816bf8f01cfea414140de5dae2223"; got != want {
		t.Fatalf("sha256 prefix of abc = %s, want %s", got, want)
	}
	// An all-zero digest prefix still gives a valid id.
	if id := traceIDFromDigest(make([]byte, 32)); !id.IsValid() || id[15] != 1 {
		t.Fatalf("zero digest gave %v", id)
	}
}
