package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/cacheblend/cacheblend/rpc/mtls"
)

func init() { subcommands = append(subcommands, newCertsCmd) }

// defaultCertValidity is the validity of cb certs's certificates.
const defaultCertValidity = 90 * 24 * time.Hour

func newCertsCmd() *cobra.Command {
	var (
		dir      string
		hosts    []string
		validity time.Duration
		force    bool
	)
	cmd := &cobra.Command{
		Use:   "certs",
		Short: "Write a CA certificate and the certificates and keys of cb engine, cb worker and cb blend for mutual TLS",
		Long: `Write a new CA's certificate and one certificate and key per process into --dir (created 0700,
files 0600): ca.pem, cb-engine.pem, cb-engine-key.pem, cb-worker.pem, cb-worker-key.pem,
cb-blend.pem, cb-blend-key.pem. Each certificate (ECDSA P-256) names its process's role in the URI
SAN spiffe://cacheblend/<role> and is valid for the loopback addresses, localhost and every --host
(the names and addresses the peers dial). The CA's key is not written: to add a host or renew,
run cb certs again and redistribute all files. Start each process with its files:

  cb blend  --tls-cert DIR/cb-blend.pem  --tls-key DIR/cb-blend-key.pem  --tls-ca DIR/ca.pem ...
  cb worker --tls-cert DIR/cb-worker.pem --tls-key DIR/cb-worker-key.pem --tls-ca DIR/ca.pem ...
  cb engine --tls-cert DIR/cb-engine.pem --tls-key DIR/cb-engine-key.pem --tls-ca DIR/ca.pem ...`,
		RunE: func(c *cobra.Command, _ []string) error {
			if dir == "" {
				return errors.New("certs: --dir is required")
			}
			if !force {
				for _, name := range certFiles() {
					if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
						return fmt.Errorf("certs: %s exists (--force replaces it)", filepath.Join(dir, name))
					} else if !errors.Is(err, fs.ErrNotExist) {
						return err
					}
				}
			}
			all := slices.Concat(mtls.DefaultHosts, hosts)
			if err := mtls.WriteDir(dir, all, validity); err != nil {
				return err
			}
			out := c.OutOrStdout()
			fmt.Fprintf(out, "wrote a CA and certificates for %v, valid for %s, hosts %v:\n", mtls.Roles, validity, all)
			for _, name := range certFiles() {
				fmt.Fprintln(out, "  "+filepath.Join(dir, name))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", "directory to write the files to (created with mode 0700)")
	f.StringArrayVar(&hosts, "host", nil, "host name or IP address the processes are dialled at, added to every certificate (repeatable; loopback and localhost are always in)")
	f.DurationVar(&validity, "validity", defaultCertValidity, "validity of the CA and the certificates")
	f.BoolVar(&force, "force", false, "replace existing files")
	return withEnv(cmd)
}

// certFiles are the names of the files cb certs writes.
func certFiles() []string {
	names := []string{mtls.CAFile}
	for _, r := range mtls.Roles {
		names = append(names, mtls.CertFile(r), mtls.KeyFile(r))
	}
	return names
}
