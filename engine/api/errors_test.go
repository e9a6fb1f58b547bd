package api

import (
	"net/http/httptest"
	"testing"
	"time"
)

func TestRetryAfterDurationHeaders(t *testing.T) {
	for _, tc := range []struct {
		d      time.Duration
		secs   string
		millis string
	}{
		{0, "1", "1"},
		{10 * time.Millisecond, "1", "10"},
		{2570 * time.Millisecond, "3", "2570"},
		{2*time.Second + time.Microsecond, "3", "2001"},
	} {
		rec := httptest.NewRecorder()
		QueueFull(8).WithRetryAfterDuration(tc.d).Write(rec)
		if s, ms := rec.Header().Get("Retry-After"), rec.Header().Get("Retry-After-Ms"); s != tc.secs || ms != tc.millis {
			t.Errorf("%v: Retry-After %q, Retry-After-Ms %q; want %q, %q", tc.d, s, ms, tc.secs, tc.millis)
		}
	}
}
