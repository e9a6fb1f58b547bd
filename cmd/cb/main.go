package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"

	"github.com/spf13/cobra"

	"github.com/cacheblend/cacheblend/service"
)

func main() {
	stop := startCPUProfile()
	root := newRoot()
	err := root.Execute()
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "cb:", err)
		os.Exit(1)
	}
}

// startCPUProfile starts a CPU profile of the whole process when the
// environment sets CB_CPUPROFILE to a directory: the profile is written to
// <dir>/<subcommand>-<pid>.pprof by the returned function (called when the
// subcommand returns, e.g. after a graceful shutdown on SIGTERM). It is how the
// per-request CPU of the engine and the blend server is profiled under load
// (e2e BenchmarkRequestCPU passes it on).
func startCPUProfile() (stop func()) {
	dir := os.Getenv("CB_CPUPROFILE")
	if dir == "" || len(os.Args) < 2 {
		return func() {}
	}
	path := filepath.Join(dir, fmt.Sprintf("%s-%d.pprof", filepath.Base(os.Args[1]), os.Getpid()))
	f, err := os.Create(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cb: CB_CPUPROFILE:", err)
		return func() {}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		fmt.Fprintln(os.Stderr, "cb: CB_CPUPROFILE:", err)
		f.Close()
		return func() {}
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "cb: CB_CPUPROFILE:", err)
		}
	}
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "cb",
		Short:         "cacheblend: LLM serving with CacheBlend KV reuse, observable end to end",
		Version:       service.Version,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	for _, c := range subcommands {
		root.AddCommand(c())
	}
	return root
}

// subcommands is filled by the init functions of the files of this package,
// one file per subcommand.
var subcommands []func() *cobra.Command
