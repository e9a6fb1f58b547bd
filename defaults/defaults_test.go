package defaults

import (
	"testing"
	"time"
)

func TestPositive(t *testing.T) {
	tests := []struct {
		name   string
		v, got time.Duration
	}{
		{"zero takes the default", 0, time.Second},
		{"negative takes the default", -3, time.Second},
		{"positive is kept", 5, 5},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := tc.v
			Positive(&v, time.Second)
			if v != tc.got {
				t.Fatalf("Positive(%v) = %v, want %v", tc.v, v, tc.got)
			}
		})
	}
	f := 0.0
	Positive(&f, 0.5)
	if f != 0.5 {
		t.Fatalf("float: %v", f)
	}
}
