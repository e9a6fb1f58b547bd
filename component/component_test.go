package component

import (
	"bytes"
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cacheblend/cacheblend/telemetry"
)

func TestWithDefaults(t *testing.T) {
	d := Deps{}.WithDefaults()
	if d.TracerProvider == nil || d.Logger == nil || d.Profile != nil {
		t.Fatalf("defaults not applied: %+v", d)
	}
	if _, ok := d.Registerer.(*prometheus.Registry); !ok {
		t.Fatalf("default registerer is %T, want a private *prometheus.Registry", d.Registerer)
	}
	if d2 := (Deps{}).WithDefaults(); d2.Registerer == d.Registerer {
		t.Fatal("two WithDefaults calls share a registry")
	}
	d.Logger.Info("discarded") // must not panic

	reg := prometheus.NewRegistry()
	var buf bytes.Buffer
	given := Deps{Registerer: reg, Profile: &buf}.WithDefaults()
	if given.Registerer != reg || given.Profile != &buf {
		t.Fatalf("set fields replaced: %+v", given)
	}
}

// A nil *telemetry.ProfileSink (profiling off) is no profile: WithDefaults
// turns it into a nil interface and the span helper does not profile.
func TestTypedNilProfile(t *testing.T) {
	var off *telemetry.ProfileSink
	d := Deps{Profile: off}
	if got := d.WithDefaults().Profile; got != nil {
		t.Fatalf("Profile = %#v, want a nil interface", got)
	}
	if d.Spans("test").Profiling() {
		t.Fatal("span helper profiles with a nil sink")
	}
}

func TestSpansProfile(t *testing.T) {
	var buf bytes.Buffer
	s := Deps{Profile: &buf}.Spans("test")
	if !s.Profiling() {
		t.Fatal("span helper does not profile with a writer")
	}
	_, sp := s.Start(context.Background(), "x")
	sp.End()
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(buf.Bytes(), []byte(`"name":"x"`)) {
		t.Fatalf("profile lacks the span: %q", buf.String())
	}
}
