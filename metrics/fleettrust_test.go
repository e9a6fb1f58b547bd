package metrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestFleetTrustTotals: the refused counters follow the tier's running
// totals, a total going down is refused (the others still move), and the
// reachability gauge is 1 or 0.
func TestFleetTrustTotals(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewFleetTrust(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.SetTotals(FleetTrustStats{Unauthenticated: 3, Oversize: 8, NonFinite: 1, Reachable: true})
	m.SetTotals(FleetTrustStats{Unauthenticated: 2, Oversize: 9, Malformed: 1, WriteNonFinite: 4})
	fams := gather(t, reg)
	for _, tc := range []struct {
		reason string
		want   float64
	}{
		{"unauthenticated", 3}, {"oversize", 9}, {"malformed", 1}, {"non_finite", 1}, {"write_non_finite", 4},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			if v := value(fams, "lmcache_blend_remote_refused_total", map[string]string{"reason": tc.reason}); v != tc.want {
				t.Fatalf("got %v, want %v", v, tc.want)
			}
		})
	}
	if v := value(fams, "lmcache_blend_remote_reachable", nil); v != 0 {
		t.Fatalf("reachable %v, want 0", v)
	}
	if st := m.Registry().RecordStats(); st.Refused != 1 {
		t.Fatalf("refused records %d, want 1 (the decreasing total)", st.Refused)
	}
}
