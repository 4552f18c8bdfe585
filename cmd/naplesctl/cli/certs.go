package cli

import (
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/credentials"

	"github.com/naplesnet/naples/internal/exitstatus"
	"github.com/naplesnet/naples/internal/pki"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Environment variables that set the defaults of the TLS flags.
const (
	// TLSCertEnv names the environment variable that sets the default of --tls-cert.
	TLSCertEnv = "NAPLES_TLS_CERT"
	// TLSKeyEnv names the environment variable that sets the default of --tls-key.
	TLSKeyEnv = "NAPLES_TLS_KEY"
	// TLSCAEnv names the environment variable that sets the default of --tls-ca.
	TLSCAEnv = "NAPLES_TLS_CA"
	// TLSServerNameEnv names the environment variable that sets the default of
	// --tls-server-name.
	TLSServerNameEnv = "NAPLES_TLS_SERVER_NAME"
	// InsecureEnv names the environment variable that, set to 1 or true, makes --insecure
	// the default.
	InsecureEnv = "NAPLES_INSECURE"

	// DefaultPKIDir is where the TLS flags' default files are, under the home directory,
	// and the default of certs --dir.
	DefaultPKIDir = ".naples/pki"
)

// tlsFlags are the global flags that say how naplesctl authenticates to nimbus.
type tlsFlags struct {
	cert, key, ca string
	serverName    string
	insecure      bool
}

// addTLSFlags adds the global --tls-cert, --tls-key, --tls-ca, --tls-server-name and
// --insecure flags to root.
func (c *cli) addTLSFlags(root *cobra.Command, getenv func(string) string) {
	dir := defaultPKIDir(getenv)
	def := func(env, file string) string {
		if v := getenv(env); v != "" {
			return v
		}
		return filepath.Join(dir, file)
	}
	insecure, _ := strconv.ParseBool(getenv(InsecureEnv)) // anything else is false
	f := root.PersistentFlags()
	f.StringVar(&c.tls.cert, "tls-cert", def(TLSCertEnv, "publisher.crt"),
		"`file` of the client certificate naplesctl presents to nimbus ($"+TLSCertEnv+")")
	f.StringVar(&c.tls.key, "tls-key", def(TLSKeyEnv, "publisher.key"),
		"`file` of the client certificate's private key ($"+TLSKeyEnv+")")
	f.StringVar(&c.tls.ca, "tls-ca", def(TLSCAEnv, "ca.crt"),
		"`file` of the CA certificates that verify nimbus ($"+TLSCAEnv+")")
	serverName := getenv(TLSServerNameEnv)
	if serverName == "" {
		serverName = pki.DefaultServerName
	}
	f.StringVar(&c.tls.serverName, "tls-server-name", serverName,
		"`name` nimbus's certificate is verified for ($"+TLSServerNameEnv+")")
	f.BoolVar(&c.tls.insecure, "insecure", insecure,
		"talk to nimbus in plaintext, without TLS ($"+InsecureEnv+")")
}

// defaultPKIDir returns ~/.naples/pki, or .naples/pki when there is no home directory.
func defaultPKIDir(getenv func(string) string) string {
	home := getenv("HOME")
	if home == "" {
		home, _ = os.UserHomeDir()
	}
	return filepath.Join(home, DefaultPKIDir)
}

// transportCredentials returns the credentials of the connection to nimbus: TLS with the
// files of the TLS flags, or plaintext with --insecure. It warns on stderr when the
// client certificate expires within pki.DefaultExpiryWarning.
func (c *cli) transportCredentials() (credentials.TransportCredentials, error) {
	if c.tls.insecure {
		return pki.TransportCredentials(nil), nil
	}
	cfg, err := pki.ClientConfig(c.tls.cert, c.tls.key, c.tls.ca, c.tls.serverName)
	var certs *pki.Expiry
	if err == nil {
		certs, err = pki.ReadExpiry(pki.CertFile{Use: pki.UseClient, Path: c.tls.cert})
	}
	if err != nil {
		return nil, exitstatus.Mark(fmt.Errorf("loading TLS credentials (naplesctl certs makes them; --insecure talks plaintext): %w", err))
	}
	for _, w := range certs.Warnings(c.now(), pki.DefaultExpiryWarning) {
		fmt.Fprintf(c.stderr, "%s; naplesctl certs --renew renews it\n", w)
	}
	return pki.TransportCredentials(cfg), nil
}

// certsOptions are the flags of the certs command.
type certsOptions struct {
	dir         string
	nodes       []string
	replicas    []string
	publisher   string
	serverHosts []string
	// etcdMembers are NAME or NAME=HOST.
	etcdMembers []string
	// fixPermissions makes a group- or world-writable dir, or a key others may read,
	// private instead of refusing it.
	fixPermissions bool
	// renew reissues the certificates that expire within renewWithin.
	renew       bool
	renewWithin time.Duration
	// revoke names the pairs whose certificates go into the CA's revocation list.
	revoke []string
}

// Files certs writes besides one pair per node and per replica.
const (
	caFile        = "ca"
	serverFile    = "nimbus"
	publisherFile = "publisher"
	// replicaPrefix starts the file name of a replica's pair, so that a replica and a node
	// of the same host name, as when a host runs both, have a pair each.
	replicaPrefix = "replica-"
	// etcdDir is the subdirectory of etcd's CA and certificates, and etcdClientFile the
	// name of the replicas' client certificate towards etcd in it.
	etcdDir        = "etcd"
	etcdClientFile = "nimbus"
	// etcdCAName is the CommonName of etcd's CA.
	etcdCAName = "naples etcd CA"
)

// certsCommand returns the certs command.
func (c *cli) certsCommand(getenv func(string) string) *cobra.Command {
	var o certsOptions
	cmd := &cobra.Command{
		Use:   "certs [--dir DIR] [--fix-permissions] [--nodes NODE,...] [--replicas NAME,...] [--publisher NAME] [--server-hosts HOST,...] [--etcd-members NAME[=HOST],...] | --renew [--renew-within DURATION] | --revoke NAME,...",
		Short: "Make a CA and the certificates of nimbus, its replicas, a publisher and nodes",
		Long: `Make a CA and the certificates nimbus, naplesctl and the agents speak mutual TLS with,
for tests and small deployments. It writes into --dir:

  ca.crt, ca.key                 the CA; an existing one is used, not replaced
  nimbus.crt, nimbus.key         nimbus's server certificate, for the names nimbus and
                                 localhost, 127.0.0.1, ::1 and each of --server-hosts
  publisher.crt, publisher.key   a publisher certificate named --publisher, for naplesctl
                                 and controllers
  NODE.crt, NODE.key             a node certificate for each of --nodes; on the node,
                                 the agent reads it as /etc/naples/pki/node.crt and .key
  replica-NAME.crt, .key         for each of --replicas, the certificate of the nimbus
                                 replica of that --replica-name: its server certificate,
                                 for the names of nimbus.crt and NAME, and its client
                                 certificate towards the other replicas
  etcd/ca.crt, etcd/ca.key       with --etcd-members, a CA of etcd's own: etcd lets every
                                 certificate its CA issued read and write every object,
                                 so it must not be the CA of the nodes
  etcd/NAME.crt, .key            for each of --etcd-members, the member's certificate for
                                 its clients and its peers alike (server and client
                                 authentication), for the names NAME, localhost,
                                 127.0.0.1, ::1 and HOST when given as NAME=HOST
  etcd/nimbus.crt, .key          with --etcd-members, the client certificate the nimbus
                                 replicas present to etcd (--etcd-cert, --etcd-key)

A certificate and key that already exist, were issued by the CA and are what was asked
for are kept, so certs can run again to add nodes; one that differs is an error until it
is removed. Keys are written with mode 0600. certs talks to no server.

certs refuses a --dir (or DIR/etcd) that group or others may write, a CA key they may
read or write, another key others may read or write or the group write, and a
certificate they may write, naming each and its mode; --fix-permissions makes them
private instead (directories 0700, or 0750 when the group reads them; keys 0600, or
0640 when the group reads them, which lets nimbus's group read its key; CA keys 0600).

--renew reissues every certificate of --dir (and of DIR/etcd, with etcd's CA) that
expires within --renew-within (default 720h): the same names and usages, a new key
pair, the same CA, each file keeping its group (and a key its group's read permission,
as nimbus's key needs). It prints what it renewed; copy the renewed files over the old
ones (the key last) and nimbus and the agents load them within a second, without a
restart.

--revoke NAME,... adds the certificates of NAME.crt to DIR/ca.crl, the revocation list
signed by the CA that nimbus reads with --tls-crl and checks again every few seconds:
it refuses those certificates' handshakes and closes their open connections.`,
		Example: `  naplesctl certs --dir /etc/naples/pki --nodes host-a,host-b --server-hosts nimbus.example,10.0.0.1
  naplesctl certs --dir ./pki --nodes host-c   # adds host-c's certificate, keeps the rest
  naplesctl certs --dir ./pki --replicas nimbus-1,nimbus-2,nimbus-3 --server-hosts nimbus.example
  naplesctl certs --dir ./pki --etcd-members etcd-1=10.0.0.11,etcd-2=10.0.0.12,etcd-3=10.0.0.13
  naplesctl certs --dir /etc/naples/pki --renew --renew-within 720h
  naplesctl certs --dir /etc/naples/pki --revoke host-b`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkPermissions(c.stdout, o.dir, o.fixPermissions); err != nil {
				return err
			}
			switch {
			case o.renew || len(o.revoke) > 0:
				for _, f := range []string{"nodes", "replicas", "publisher", "server-hosts", "etcd-members"} {
					if cmd.Flags().Changed(f) {
						return exitstatus.Mark(fmt.Errorf("--%s: --renew and --revoke work on what --dir holds; make new certificates in a run of their own", f))
					}
				}
				if len(o.revoke) > 0 {
					// --revoke writes the revocation list only: --renew and --renew-within
					// given with it would be ignored, so they are refused.
					for _, f := range []string{"renew", "renew-within"} {
						if cmd.Flags().Changed(f) {
							return exitstatus.Mark(fmt.Errorf("--%s: goes with --renew, not with --revoke; renew and revoke in runs of their own", f))
						}
					}
					return c.revokeCerts(o)
				}
				return c.renewCerts(o)
			case cmd.Flags().Changed("renew-within"):
				return exitstatus.Mark(errors.New("--renew-within: goes with --renew"))
			}
			return c.certs(o)
		},
	}
	cmd.Flags().StringVar(&o.dir, "dir", defaultPKIDir(getenv), "directory to write into; created when missing")
	cmd.Flags().StringSliceVar(&o.nodes, "nodes", nil, "node names to make node certificates for")
	cmd.Flags().StringSliceVar(&o.replicas, "replicas", nil, "names of nimbus replicas (their --replica-name) to make replica certificates for")
	cmd.Flags().StringVar(&o.publisher, "publisher", "admin", "name of the publisher certificate")
	cmd.Flags().StringSliceVar(&o.serverHosts, "server-hosts", nil, "further DNS names and IP addresses of nimbus's certificate")
	cmd.Flags().BoolVar(&o.fixPermissions, "fix-permissions", false, "make --dir and its keys private (directories 0700, or 0750 when the group may read them; keys 0600, or 0640 when the group may read them, but CA keys) instead of refusing them")
	cmd.Flags().BoolVar(&o.renew, "renew", false, "reissue the certificates of --dir that expire within --renew-within: same names, a new key, the same CA")
	cmd.Flags().DurationVar(&o.renewWithin, "renew-within", pki.DefaultExpiryWarning, "with --renew, renew the certificates that expire within this `duration`")
	cmd.Flags().StringSliceVar(&o.revoke, "revoke", nil, "`names` of pairs in --dir (host-a for host-a.crt) whose certificates to add to DIR/ca.crl, the revocation list nimbus reads with --tls-crl")
	cmd.Flags().StringSliceVar(&o.etcdMembers, "etcd-members", nil, "etcd members to make certificates for, with etcd's own CA, in DIR/etcd: NAME, or NAME=HOST with a DNS name or IP address it is reached by")
	return cmd
}

// certs makes or keeps the CA and every certificate o asks for, saying what it did.
func (c *cli) certs(o certsOptions) error {
	for _, n := range o.nodes {
		if err := nimbusv1.ValidateNodeName(n); err != nil {
			return exitstatus.Mark(fmt.Errorf("--nodes: %w", err))
		}
		if slices.Contains([]string{caFile, serverFile, publisherFile}, n) {
			return exitstatus.Mark(fmt.Errorf("--nodes: node %q would overwrite %s.crt; rename the node", n, n))
		}
	}
	for _, r := range o.replicas {
		if r == "" || strings.ContainsAny(r, `/\`) {
			return exitstatus.Mark(fmt.Errorf("--replicas: replica name %q: must be a non-empty name without '/' or '\\'", r))
		}
		if slices.Contains(o.nodes, replicaPrefix+r) {
			return exitstatus.Mark(fmt.Errorf("--replicas: replica %q would overwrite node %q's %s%s.crt; rename one of them", r, replicaPrefix+r, replicaPrefix, r))
		}
	}
	if o.publisher == "" {
		return exitstatus.Mark(errors.New("--publisher: a name is required"))
	}
	members, err := parseEtcdMembers(o.etcdMembers)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(o.dir, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", o.dir, err)
	}
	ca, err := c.ensureCA(o.dir, "")
	if err != nil {
		return err
	}
	servers := append([]string{pki.DefaultServerName, "localhost", "127.0.0.1", "::1"}, o.serverHosts...)
	if err := c.ensureCert(ca, o.dir, serverFile, fmt.Sprintf("server certificate for %s", strings.Join(servers, ", ")),
		func(cert *x509.Certificate) error {
			if !slices.Contains(cert.ExtKeyUsage, x509.ExtKeyUsageServerAuth) {
				return errors.New("not a server certificate")
			}
			return verifyHostnames(cert, servers)
		},
		func() (pki.KeyPair, error) { return ca.IssueServer(o.serverHosts, pki.CertOptions{}) },
	); err != nil {
		return err
	}
	if err := c.ensureCert(ca, o.dir, publisherFile, fmt.Sprintf("publisher certificate for %q", o.publisher),
		wantIdentity(pki.Identity{Role: pki.RolePublisher, Name: o.publisher}),
		func() (pki.KeyPair, error) { return ca.IssuePublisher(o.publisher, pki.CertOptions{}) },
	); err != nil {
		return err
	}
	for _, n := range o.nodes {
		if err := c.ensureCert(ca, o.dir, n, fmt.Sprintf("node certificate for %q", n),
			wantIdentity(pki.Identity{Role: pki.RoleNode, Name: n}),
			func() (pki.KeyPair, error) { return ca.IssueNode(n, pki.CertOptions{}) },
		); err != nil {
			return err
		}
	}
	for _, r := range o.replicas {
		names := append(slices.Clone(servers), r)
		if err := c.ensureCert(ca, o.dir, replicaPrefix+r, fmt.Sprintf("replica certificate for %q, for %s", r, strings.Join(names, ", ")),
			func(cert *x509.Certificate) error {
				if err := wantIdentity(pki.Identity{Role: pki.RoleReplica, Name: r})(cert); err != nil {
					return err
				}
				if err := wantUsages(cert, x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth); err != nil {
					return err
				}
				return verifyHostnames(cert, names)
			},
			func() (pki.KeyPair, error) { return ca.IssueReplica(r, o.serverHosts, pki.CertOptions{}) },
		); err != nil {
			return err
		}
	}
	if len(members) > 0 {
		return c.etcdCerts(filepath.Join(o.dir, etcdDir), members)
	}
	return nil
}

// etcdMember is a member of --etcd-members: its name, and the host it is reached by when
// given.
type etcdMember struct {
	name, host string
}

// parseEtcdMembers parses --etcd-members: NAME or NAME=HOST each.
func parseEtcdMembers(args []string) ([]etcdMember, error) {
	var members []etcdMember
	for _, a := range args {
		name, host, withHost := strings.Cut(a, "=")
		switch {
		case name == "" || strings.ContainsAny(name, `/\`):
			return nil, fmt.Errorf("--etcd-members: member %q: the name must be non-empty, without '/' or '\\'", a)
		case withHost && host == "":
			return nil, fmt.Errorf("--etcd-members: member %q: no host after '='", a)
		case name == caFile || name == etcdClientFile:
			return nil, fmt.Errorf("--etcd-members: member %q would overwrite %s/%s.crt; rename the member", a, etcdDir, name)
		case slices.ContainsFunc(members, func(m etcdMember) bool { return m.name == name }):
			return nil, fmt.Errorf("--etcd-members: member %q is listed twice", name)
		}
		members = append(members, etcdMember{name: name, host: host})
	}
	return members, nil
}

// etcdCerts makes or keeps, in dir, etcd's CA, the members' certificates and the
// replicas' client certificate.
func (c *cli) etcdCerts(dir string, members []etcdMember) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	ca, err := c.ensureCA(dir, etcdCAName)
	if err != nil {
		return err
	}
	for _, m := range members {
		var hosts []string
		names := []string{m.name, "localhost", "127.0.0.1", "::1"}
		if m.host != "" {
			hosts = append(hosts, m.host)
			if !slices.Contains(names, m.host) {
				names = append(names, m.host)
			}
		}
		if err := c.ensureCert(ca, dir, m.name, fmt.Sprintf("etcd member certificate for %s", strings.Join(names, ", ")),
			func(cert *x509.Certificate) error {
				if err := wantUsages(cert, x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth); err != nil {
					return err
				}
				return verifyHostnames(cert, names)
			},
			func() (pki.KeyPair, error) { return ca.IssueEtcdMember(m.name, hosts, pki.CertOptions{}) },
		); err != nil {
			return err
		}
	}
	return c.ensureCert(ca, dir, etcdClientFile, "etcd client certificate of the nimbus replicas",
		func(cert *x509.Certificate) error { return wantUsages(cert, x509.ExtKeyUsageClientAuth) },
		func() (pki.KeyPair, error) { return ca.IssueEtcdClient(etcdClientFile, pki.CertOptions{}) },
	)
}

// wantUsages checks that a certificate is for every one of usages.
func wantUsages(cert *x509.Certificate, usages ...x509.ExtKeyUsage) error {
	for _, u := range usages {
		if !slices.Contains(cert.ExtKeyUsage, u) {
			return fmt.Errorf("not for %s", usageName(u))
		}
	}
	return nil
}

// usageName names an extended key usage as OpenSSL's configuration does.
func usageName(u x509.ExtKeyUsage) string {
	switch u {
	case x509.ExtKeyUsageServerAuth:
		return "serverAuth"
	case x509.ExtKeyUsageClientAuth:
		return "clientAuth"
	}
	return fmt.Sprintf("extended key usage %d", u)
}

// verifyHostnames checks that the certificate is valid for every one of names.
func verifyHostnames(cert *x509.Certificate, names []string) error {
	for _, h := range names {
		if err := cert.VerifyHostname(h); err != nil {
			return err
		}
	}
	return nil
}

// wantIdentity returns a check that a certificate names id.
func wantIdentity(id pki.Identity) func(*x509.Certificate) error {
	return func(cert *x509.Certificate) error {
		got, err := pki.IdentityOf(cert)
		if err != nil {
			return err
		}
		if got != id {
			return fmt.Errorf("names %s, not %s", got, id)
		}
		return nil
	}
}

// ensureCA loads the CA of dir, or makes one named commonName (default: pki's) when dir
// has none.
func (c *cli) ensureCA(dir, commonName string) (*pki.CA, error) {
	certPath, keyPath := pairPaths(dir, caFile)
	exists, err := pairExists(certPath, keyPath)
	if err != nil {
		return nil, err
	}
	if exists {
		ca, err := pki.LoadCA(certPath, keyPath)
		if err != nil {
			return nil, fmt.Errorf("using the existing CA: %w", err)
		}
		fmt.Fprintf(c.stdout, "kept    %s, %s: CA %q\n", certPath, keyPath, ca.Cert.Subject.CommonName)
		return ca, nil
	}
	ca, err := pki.NewCA(pki.CAOptions{CommonName: commonName})
	if err != nil {
		return nil, err
	}
	if err := ca.WriteFiles(certPath, keyPath); err != nil {
		return nil, err
	}
	fmt.Fprintf(c.stdout, "wrote   %s, %s: CA %q, valid until %s\n", certPath, keyPath,
		ca.Cert.Subject.CommonName, ca.Cert.NotAfter.Format(time.DateOnly))
	return ca, nil
}

// ensureCert keeps the pair name.crt and name.key in dir when the CA issued it, it is
// valid now and check accepts it, and writes a new pair from issue when there is none.
// A pair that exists but is not to be kept is an error: certs never replaces a
// certificate that someone may be using.
func (c *cli) ensureCert(ca *pki.CA, dir, name, what string, check func(*x509.Certificate) error, issue func() (pki.KeyPair, error)) error {
	certPath, keyPath := pairPaths(dir, name)
	exists, err := pairExists(certPath, keyPath)
	if err != nil {
		return err
	}
	if exists {
		kp, err := pki.LoadKeyPair(certPath, keyPath)
		if err != nil {
			return err
		}
		now := time.Now()
		switch {
		case kp.Cert.CheckSignatureFrom(ca.Cert) != nil:
			err = errors.New("not issued by the CA")
		case now.After(kp.Cert.NotAfter):
			err = fmt.Errorf("expired on %s", kp.Cert.NotAfter.Format(time.DateOnly))
		default:
			err = check(kp.Cert)
		}
		if err != nil {
			return fmt.Errorf("keeping %s: %w; remove it and its key to make a new %s", certPath, err, what)
		}
		fmt.Fprintf(c.stdout, "kept    %s, %s: %s\n", certPath, keyPath, what)
		return nil
	}
	kp, err := issue()
	if err != nil {
		return err
	}
	if err := kp.WriteFiles(certPath, keyPath); err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "wrote   %s, %s: %s\n", certPath, keyPath, what)
	return nil
}

// pairPaths returns the paths of name's certificate and key in dir.
func pairPaths(dir, name string) (cert, key string) {
	return filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
}

// pairExists reports whether both files exist; one without the other is an error.
func pairExists(certPath, keyPath string) (bool, error) {
	exists := func(p string) (bool, error) {
		_, err := os.Stat(p)
		if errors.Is(err, fs.ErrNotExist) {
			return false, nil
		}
		return err == nil, err
	}
	c, err := exists(certPath)
	if err != nil {
		return false, fmt.Errorf("checking %s: %w", certPath, err)
	}
	k, err := exists(keyPath)
	if err != nil {
		return false, fmt.Errorf("checking %s: %w", keyPath, err)
	}
	switch {
	case c && !k:
		return false, fmt.Errorf("%s exists without its key %s; restore the key or remove the certificate", certPath, keyPath)
	case k && !c:
		return false, fmt.Errorf("%s exists without its certificate %s; restore the certificate or remove the key", keyPath, certPath)
	}
	return c, nil
}
