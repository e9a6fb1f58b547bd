package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/cacheblend/cacheblend/contract"
	"github.com/cacheblend/cacheblend/slo"
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
			return writeFileAtomic(out, data)
		},
	}
	cmd.Flags().StringVarP(&out, "out", "o", "", "write the rules to this file instead of stdout (replaced atomically)")
	return withEnv(cmd)
}

// writeFileAtomic writes data to a temporary file next to path and renames it over path.
func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
