package main

import (
	"github.com/spf13/cobra"

	"github.com/cacheblend/cacheblend/contract"
	"github.com/cacheblend/cacheblend/slo"
	"github.com/cacheblend/cacheblend/stack"
)

func init() { subcommands = append(subcommands, newSLORulesCmd) }

func newSLORulesCmd() *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "slo-rules",
		Short: "Write the Prometheus recording and multi-window burn-rate alerting rules generated from contract/slo.yaml",
		Long: "Write the Prometheus recording and multi-window burn-rate alerting rules generated from contract/slo.yaml " +
			"(page at 14.4× over 1h and 5m or 6× over 6h and 30m; ticket at 3× over 1d and 2h or 1× over 3d and 6h). " +
			"The committed deploy/prometheus/slo-rules.yml is this output; the tests of package slo fail when they differ:\n\n" +
			"  cb slo-rules --out deploy/prometheus/slo-rules.yml",
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			set, err := contract.SLOs()
			if err != nil {
				return err
			}
			inst, err := contract.Instruments()
			if err != nil {
				return err
			}
			data, err := slo.Generate(set, inst)
			if err != nil {
				return err
			}
			if out == "" || out == "-" {
				_, err := c.OutOrStdout().Write(data)
				return err
			}
			return stack.WriteFileAtomic(out, data, 0o644)
		},
	}
	cmd.Flags().StringVarP(&out, "out", "o", "", "write the rules to this file instead of stdout (replaced atomically)")
	return withEnv(cmd)
}
