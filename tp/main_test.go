package tp

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain runs a rank child process when asked (TestProcessGroup), else
// the tests under goleak.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	goleak.VerifyTestMain(m)
}
