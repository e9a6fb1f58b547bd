package rankgroup

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain runs a rank process when the group under test starts one, else
// the tests under goleak.
func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(runChild(mode))
	}
	goleak.VerifyTestMain(m)
}
