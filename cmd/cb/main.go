package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/cacheblend/cacheblend/service"
)

func main() {
	root := newRoot()
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "cb:", err)
		os.Exit(1)
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
