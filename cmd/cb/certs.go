package main

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
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
run cb certs again and redistribute all files; for certificates per host from a CA you keep, use
cb certs init and cb certs issue instead. Start each process with its files:

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
	cmd.Args = cobra.NoArgs
	cmd.AddCommand(newCertsInitCmd(), newCertsIssueCmd())
	return withEnv(cmd)
}

// newCertsInitCmd is cb certs init: the operator's CA, made once.
func newCertsInitCmd() *cobra.Command {
	var (
		dir      string
		validity time.Duration
	)
	cmd := &cobra.Command{
		Use:   "init",
		Short: "Create the stack's CA (certificate and key) in --dir, once; cb certs issue then issues per host",
		Long: `Create a CA for the stack in --dir (created 0700): ca.pem, its certificate, and ca-key.pem, its key
(files 0600). Keep the directory on the operator's machine: ca-key.pem never goes to a host.
Refuses to replace an existing CA (a new CA invalidates every certificate the old one issued).
Then, per host: cb certs issue --dir DIR --host NAME --ip ADDR --role engine,worker,blend.`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if dir == "" {
				return errors.New("certs init: --dir is required")
			}
			ca, err := mtls.WriteCA(dir, validity)
			if err != nil {
				return fmt.Errorf("certs init: %w", err)
			}
			fmt.Fprintf(c.OutOrStdout(), "wrote a CA valid until %s:\n  %s\n  %s (keep it here: it issues every certificate)\n",
				ca.Certificate().NotAfter.UTC().Format(time.RFC3339), filepath.Join(dir, mtls.CAFile), filepath.Join(dir, mtls.CAKeyFile))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", "the CA's directory (created with mode 0700)")
	f.DurationVar(&validity, "validity", defaultCAValidity, "validity of the CA (the certificates it issues end with it at the latest)")
	return cmd
}

// defaultCAValidity is the validity of cb certs init's CA.
const defaultCAValidity = 5 * 365 * 24 * time.Hour

// newCertsIssueCmd is cb certs issue: one host's certificates from the CA
// of cb certs init.
func newCertsIssueCmd() *cobra.Command {
	var (
		dir, host, out string
		ips, dns       []string
		roles          []string
		validity       time.Duration
		force          bool
	)
	cmd := &cobra.Command{
		Use:   "issue",
		Short: "Issue the certificates and keys of one host's processes from the CA of cb certs init",
		Long: `Issue, from the CA in --dir (cb certs init), a key and a certificate per --role for the processes of
one host, and write them with the CA's certificate to --out (default DIR/hosts/HOST, created 0700,
files 0600): ca.pem and cb-<role>.pem, cb-<role>-key.pem per role. Other hosts' files are not
touched, so adding a host needs no restart of the others. Each certificate names its role
(spiffe://cacheblend/cb-<role>) and is valid for every --ip and --dns (the addresses and names the
host's processes are dialled at), HOST itself (as an IP address or DNS name) and the loopback
addresses and localhost (processes of the host dialling each other). Copy --out to the host:

  cb worker --tls-cert OUT/cb-worker.pem --tls-key OUT/cb-worker-key.pem --tls-ca OUT/ca.pem ...`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if dir == "" || host == "" {
				return errors.New("certs issue: --dir and --host are required")
			}
			if strings.ContainsAny(host, "/\\") || host == "." || host == ".." {
				return fmt.Errorf("certs issue: --host %q: want a host name, no path", host)
			}
			var rs []mtls.Role
			for _, name := range roles {
				r, err := mtls.ParseRole(name)
				if err != nil {
					if strings.TrimPrefix(strings.TrimSpace(name), "cb-") == "gateway" {
						return fmt.Errorf("certs issue: --role gateway: the gateway calls the engines over HTTP and needs no certificate (roles: engine, worker, blend)")
					}
					return fmt.Errorf("certs issue: %w", err)
				}
				if !slices.Contains(rs, r) {
					rs = append(rs, r)
				}
			}
			if len(rs) == 0 {
				return errors.New("certs issue: --role is required (engine, worker, blend: the processes the host runs)")
			}
			for _, ip := range ips {
				if net.ParseIP(ip) == nil {
					return fmt.Errorf("certs issue: --ip %q is not an IP address", ip)
				}
			}
			ca, err := mtls.LoadCA(dir)
			if err != nil {
				return fmt.Errorf("certs issue: %w", err)
			}
			if out == "" {
				out = filepath.Join(dir, "hosts", host)
			}
			sans := slices.Concat(ips, dns, []string{host}, mtls.DefaultHosts)
			sans = slices.Compact(sans)
			if err := ca.WriteHost(out, rs, sans, validity, force); err != nil {
				if errors.Is(err, mtls.ErrExists) {
					return fmt.Errorf("certs issue: %w (--force replaces this host's files)", err)
				}
				return fmt.Errorf("certs issue: %w", err)
			}
			w := c.OutOrStdout()
			fmt.Fprintf(w, "issued %v for host %s, valid for %s, SANs %v:\n", rs, host, validity, sans)
			fmt.Fprintln(w, "  "+filepath.Join(out, mtls.CAFile))
			for _, r := range rs {
				fmt.Fprintln(w, "  "+filepath.Join(out, mtls.CertFile(r)))
				fmt.Fprintln(w, "  "+filepath.Join(out, mtls.KeyFile(r)))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", "the CA's directory (cb certs init)")
	f.StringVar(&host, "host", "", "the host's name: the default output directory DIR/hosts/HOST, and a SAN (an IP address or DNS name)")
	f.StringArrayVar(&ips, "ip", nil, "IP address the host's processes are dialled at (repeatable)")
	f.StringArrayVar(&dns, "dns", nil, "DNS name the host's processes are dialled at (repeatable)")
	f.StringSliceVar(&roles, "role", nil, "processes the host runs: engine, worker, blend (comma-separated or repeatable)")
	f.StringVar(&out, "out", "", "directory to write the host's files to (default DIR/hosts/HOST)")
	f.DurationVar(&validity, "validity", defaultCertValidity, "validity of the certificates (cut to the CA's)")
	f.BoolVar(&force, "force", false, "replace this host's existing files")
	return cmd
}

// certFiles are the names of the files cb certs writes.
func certFiles() []string {
	names := []string{mtls.CAFile}
	for _, r := range mtls.Roles {
		names = append(names, mtls.CertFile(r), mtls.KeyFile(r))
	}
	return names
}
