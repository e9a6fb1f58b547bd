package main

import (
	"cmp"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// envName is the environment variable that sets a flag of a subcommand:
// CB_<COMMAND>_<FLAG>, upper case, dashes as underscores
// (cb engine --api-key ⇐ CB_ENGINE_API_KEY).
func envName(cmd, flag string) string {
	r := strings.NewReplacer("-", "_", ".", "_")
	return "CB_" + strings.ToUpper(r.Replace(cmd)) + "_" + strings.ToUpper(r.Replace(flag))
}

// applyEnv sets every flag of cmd that was not given on the command line from
// its CB_<COMMAND>_<FLAG> variable: defaults, then environment, then flags.
func applyEnv(cmd *cobra.Command) error {
	var err error
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Changed {
			return
		}
		if v, ok := os.LookupEnv(envName(cmd.Name(), f.Name)); ok {
			if e := f.Value.Set(v); e != nil {
				err = fmt.Errorf("%s=%q: %w", envName(cmd.Name(), f.Name), v, e)
			}
		}
	})
	return err
}

// withEnv makes a command read its flags' environment variables before it
// runs (its PreRunE) and lists them in its help.
func withEnv(cmd *cobra.Command) *cobra.Command {
	cmd.PreRunE = func(c *cobra.Command, _ []string) error { return applyEnv(c) }
	cmd.Long = strings.TrimSpace(cmp.Or(cmd.Long, cmd.Short+".")) + "\n\nEvery flag can also be set by the environment variable " +
		envName(cmd.Name(), "<FLAG>") + " (upper case, dashes as underscores); a flag given on the command line wins."
	return cmd
}
