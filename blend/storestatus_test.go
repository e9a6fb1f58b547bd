package blend

import (
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/cacheblend/cacheblend/blend/chunkstore"
)

// TestClassifyStoreErr: a store's joined per-chunk errors decide its
// document's state: L2 writes of chunks still in memory are memory_only
// (with the root cause), anything else failed.
func TestClassifyStoreErr(t *testing.T) {
	full := &chunkstore.L2WriteError{InL1: true, DiskFull: true, Err: fmt.Errorf("write x: %w", syscall.ENOSPC)}
	lost := &chunkstore.L2WriteError{InL1: false, Err: fmt.Errorf("write x: %w", syscall.EIO)}
	for _, tc := range []struct {
		name      string
		err       error
		state     string
		wantCause string
	}{
		{"nil", nil, StoreStored, ""},
		{"disk full", errors.Join(fmt.Errorf("chunk 0: %w", full), fmt.Errorf("chunk 1: %w", full)), StoreMemoryOnly, "no space left on device"},
		{"not in memory either", errors.Join(fmt.Errorf("chunk 0: %w", full), fmt.Errorf("chunk 1: %w", lost)), StoreFailed, "no space left on device"},
		{"other error", errors.Join(fmt.Errorf("chunk 0: %w", errors.New("gather: bad block"))), StoreFailed, "gather: bad block"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state, cause := classifyStoreErr(tc.err)
			if state != tc.state || cause != tc.wantCause {
				t.Fatalf("classify = %q %q, want %q %q", state, cause, tc.state, tc.wantCause)
			}
		})
	}
}
