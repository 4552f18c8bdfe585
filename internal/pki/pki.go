package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"slices"
	"strings"
	"time"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Organizations that mark the role of a certificate, and defaults of the options.
const (
	// OrganizationNode is the Organization of a node's certificate.
	OrganizationNode = "naples:node"
	// OrganizationPublisher is the Organization of a publisher's certificate.
	OrganizationPublisher = "naples:publisher"
	// OrganizationReplica is the Organization of a nimbus replica's certificate.
	OrganizationReplica = "naples:replica"
	// OrganizationCA is the Organization of the CA certificate NewCA makes.
	OrganizationCA = "naples"

	// DefaultServerName is a DNS name every server certificate carries and the ServerName
	// clients verify by default.
	DefaultServerName = "nimbus"
	// DefaultCACommonName is the default of CAOptions.CommonName.
	DefaultCACommonName = "naples CA"
	// DefaultCAValidity is the default of CAOptions.Validity: ten years.
	DefaultCAValidity = 10 * 365 * 24 * time.Hour
	// DefaultCertValidity is the default of CertOptions.Validity: five years.
	DefaultCertValidity = 5 * 365 * 24 * time.Hour

	// backdate is how far before now certificates become valid, for clocks that lag.
	backdate = time.Hour
)

// Sentinel errors; check with errors.Is.
var (
	// ErrNoIdentity is wrapped by IdentityOf when a certificate names no naples identity.
	ErrNoIdentity = errors.New("certificate names no naples identity")
	// ErrNotCA is wrapped by LoadCA when the certificate is not a CA.
	ErrNotCA = errors.New("not a CA certificate")
)

// Role is what a certificate's holder is to nimbus.
type Role int

// The roles; the zero Role is none.
const (
	// RoleNode is a node: it watches its own objects and reports their status.
	RoleNode Role = iota + 1
	// RolePublisher is a publisher: it applies, deletes and reads objects.
	RolePublisher
	// RoleReplica is a nimbus replica: it pushes the statuses its agents report to the
	// other replicas.
	RoleReplica
)

// String returns "node", "publisher", "replica" or "none".
func (r Role) String() string {
	switch r {
	case RoleNode:
		return "node"
	case RolePublisher:
		return "publisher"
	case RoleReplica:
		return "replica"
	}
	return "none"
}

// Identity is who a certificate names.
type Identity struct {
	Role Role
	// Name is the node's, the publisher's or the replica's name.
	Name string
}

// String returns the identity as messages name it: `node "host-a"`.
func (id Identity) String() string { return fmt.Sprintf("%s %q", id.Role, id.Name) }

// IdentityOf returns the identity a certificate names: its role from the Organization and
// its name from the CommonName, or for a node without one its single DNS name. Its error
// wraps ErrNoIdentity when the certificate claims no role, more than one role or no valid
// name.
func IdentityOf(cert *x509.Certificate) (Identity, error) {
	var roles []string
	for _, org := range []string{OrganizationNode, OrganizationPublisher, OrganizationReplica} {
		if slices.Contains(cert.Subject.Organization, org) {
			roles = append(roles, org)
		}
	}
	node := slices.Contains(roles, OrganizationNode)
	publisher := slices.Contains(roles, OrganizationPublisher)
	replica := slices.Contains(roles, OrganizationReplica)
	cn := cert.Subject.CommonName
	switch {
	case len(roles) > 1:
		return Identity{}, fmt.Errorf("certificate %q claims the roles %s: %w", cn, strings.Join(roles, " and "), ErrNoIdentity)
	case node:
		name := cn
		if name == "" && len(cert.DNSNames) == 1 {
			name = cert.DNSNames[0]
		}
		if err := nimbusv1.ValidateNodeName(name); err != nil {
			return Identity{}, fmt.Errorf("node certificate: %w: %w", err, ErrNoIdentity)
		}
		return Identity{Role: RoleNode, Name: name}, nil
	case publisher:
		if cn == "" {
			return Identity{}, fmt.Errorf("publisher certificate without a common name: %w", ErrNoIdentity)
		}
		return Identity{Role: RolePublisher, Name: cn}, nil
	case replica:
		if cn == "" {
			return Identity{}, fmt.Errorf("replica certificate without a common name: %w", ErrNoIdentity)
		}
		return Identity{Role: RoleReplica, Name: cn}, nil
	}
	return Identity{}, fmt.Errorf("certificate %q (organization %q): want organization %s, %s or %s: %w",
		cn, cert.Subject.Organization, OrganizationNode, OrganizationPublisher, OrganizationReplica, ErrNoIdentity)
}

// KeyPair is a certificate and its private key.
type KeyPair struct {
	Cert *x509.Certificate
	// Key is the private key; the keys this package makes are *ecdsa.PrivateKey.
	Key crypto.Signer
}

// CA is a certificate authority: a self-signed CA certificate and its key.
type CA struct {
	KeyPair
}

// CAOptions configures NewCA. The zero value is usable.
type CAOptions struct {
	// CommonName names the CA. Default: DefaultCACommonName ("naples CA").
	CommonName string
	// Validity is how long the CA certificate is valid. Default: DefaultCAValidity (10y).
	Validity time.Duration
	// Now tells the time validity starts from. Default: time.Now.
	Now func() time.Time
}

// CertOptions configures the certificates a CA issues. The zero value is usable.
type CertOptions struct {
	// Validity is how long the certificate is valid; it never outlasts the CA.
	// Default: DefaultCertValidity (5y).
	Validity time.Duration
	// Now tells the time validity starts from. Default: time.Now.
	Now func() time.Time
}

// NewCA makes a CA with a fresh ECDSA P-256 key and a self-signed certificate.
func NewCA(opts CAOptions) (*CA, error) {
	if opts.CommonName == "" {
		opts.CommonName = DefaultCACommonName
	}
	if opts.Validity <= 0 {
		opts.Validity = DefaultCAValidity
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating CA key: %w", err)
	}
	now := opts.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: opts.CommonName, Organization: []string{OrganizationCA}},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(opts.Validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("signing CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parsing CA certificate: %w", err)
	}
	return &CA{KeyPair{Cert: cert, Key: key}}, nil
}

// IssueNode issues the certificate of the named node: CommonName and DNS name are the
// node name, the Organization is OrganizationNode, and it is for client authentication.
func (ca *CA) IssueNode(node string, opts CertOptions) (KeyPair, error) {
	if err := nimbusv1.ValidateNodeName(node); err != nil {
		return KeyPair{}, fmt.Errorf("issuing node certificate: %w", err)
	}
	return ca.issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: node, Organization: []string{OrganizationNode}},
		DNSNames:    []string{node},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, opts)
}

// IssuePublisher issues the certificate of the named publisher: the CommonName is the
// name, the Organization is OrganizationPublisher, and it is for client authentication.
func (ca *CA) IssuePublisher(name string, opts CertOptions) (KeyPair, error) {
	if name == "" {
		return KeyPair{}, errors.New("issuing publisher certificate: name is required")
	}
	return ca.issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: name, Organization: []string{OrganizationPublisher}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, opts)
}

// IssueServer issues nimbus's certificate for server authentication. Its names are
// DefaultServerName, "localhost", 127.0.0.1, ::1 and each of hosts, a DNS name or an IP
// address.
func (ca *CA) IssueServer(hosts []string, opts CertOptions) (KeyPair, error) {
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: DefaultServerName, Organization: []string{OrganizationCA}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if err := addServerNames(tmpl, hosts); err != nil {
		return KeyPair{}, fmt.Errorf("issuing server certificate: %w", err)
	}
	return ca.issue(tmpl, opts)
}

// IssueReplica issues the certificate of the named nimbus replica, which the replica
// serves with and presents to its peers alike: the CommonName is the name, the
// Organization is OrganizationReplica, it is for server and client authentication, and
// its names are those of IssueServer's certificates (DefaultServerName, "localhost",
// 127.0.0.1, ::1), the replica's name and each of hosts, a DNS name or an IP address. So
// agents and publishers verify it as they verify any nimbus, and replicas verify each
// other with ServerName DefaultServerName.
func (ca *CA) IssueReplica(name string, hosts []string, opts CertOptions) (KeyPair, error) {
	if name == "" {
		return KeyPair{}, errors.New("issuing replica certificate: name is required")
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: name, Organization: []string{OrganizationReplica}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	if err := addServerNames(tmpl, append([]string{name}, hosts...)); err != nil {
		return KeyPair{}, fmt.Errorf("issuing replica certificate %q: %w", name, err)
	}
	return ca.issue(tmpl, opts)
}

// IssueEtcdMember issues the certificate of the named etcd member, which it serves its
// clients and its peers with and presents to its peers: the CommonName is the name, it is
// for server and client authentication, and its names are the member's name,
// "localhost", 127.0.0.1, ::1 and each of hosts, a DNS name or an IP address. Issue it
// from a CA of etcd's own: etcd lets every certificate its CA issued use it.
func (ca *CA) IssueEtcdMember(name string, hosts []string, opts CertOptions) (KeyPair, error) {
	if name == "" {
		return KeyPair{}, errors.New("issuing etcd member certificate: name is required")
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: name},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	if err := addHostNames(tmpl, append([]string{name}, hosts...)); err != nil {
		return KeyPair{}, fmt.Errorf("issuing etcd member certificate %q: %w", name, err)
	}
	return ca.issue(tmpl, opts)
}

// IssueEtcdClient issues a certificate that an etcd client, such as a nimbus replica,
// presents to etcd: the CommonName is the name, and it is for client authentication.
func (ca *CA) IssueEtcdClient(name string, opts CertOptions) (KeyPair, error) {
	if name == "" {
		return KeyPair{}, errors.New("issuing etcd client certificate: name is required")
	}
	return ca.issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: name},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, opts)
}

// addServerNames gives tmpl the names every server certificate carries,
// DefaultServerName, "localhost", 127.0.0.1 and ::1, and each of hosts, a DNS name or an
// IP address, each once.
func addServerNames(tmpl *x509.Certificate, hosts []string) error {
	return addHostNames(tmpl, append([]string{DefaultServerName}, hosts...))
}

// addHostNames gives tmpl the names of hosts, each a DNS name or an IP address, and
// "localhost", 127.0.0.1 and ::1, each once: the first host, localhost, the others.
// hosts holds one at least.
func addHostNames(tmpl *x509.Certificate, hosts []string) error {
	tmpl.DNSNames = nil
	tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	for _, h := range append([]string{hosts[0], "localhost"}, hosts[1:]...) {
		switch ip := net.ParseIP(h); {
		case h == "":
			return errors.New("empty host name")
		case ip != nil:
			if !slices.ContainsFunc(tmpl.IPAddresses, ip.Equal) {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			}
		default:
			if !slices.Contains(tmpl.DNSNames, h) {
				tmpl.DNSNames = append(tmpl.DNSNames, h)
			}
		}
	}
	return nil
}

// issue completes tmpl with a serial, validity and key usage, and signs a fresh key.
func (ca *CA) issue(tmpl *x509.Certificate, opts CertOptions) (KeyPair, error) {
	if opts.Validity <= 0 {
		opts.Validity = DefaultCertValidity
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return KeyPair{}, fmt.Errorf("generating key for %q: %w", tmpl.Subject.CommonName, err)
	}
	now := opts.Now()
	tmpl.SerialNumber = serial()
	tmpl.NotBefore = now.Add(-backdate)
	tmpl.NotAfter = now.Add(opts.Validity)
	if tmpl.NotAfter.After(ca.Cert.NotAfter) {
		tmpl.NotAfter = ca.Cert.NotAfter
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.BasicConstraintsValid = true
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return KeyPair{}, fmt.Errorf("signing certificate for %q: %w", tmpl.Subject.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return KeyPair{}, fmt.Errorf("parsing certificate for %q: %w", tmpl.Subject.CommonName, err)
	}
	return KeyPair{Cert: cert, Key: key}, nil
}

// serial returns a random 128-bit serial number.
func serial() *big.Int {
	var b [16]byte
	rand.Read(b[:]) // never fails; see crypto/rand.Read
	return new(big.Int).SetBytes(b[:])
}

// Renew issues a certificate that replaces cert, which the CA issued: a fresh key, a new
// serial and validity from opts, and cert's subject, names (DNS names and IP addresses)
// and extended key usages.
func (ca *CA) Renew(cert *x509.Certificate, opts CertOptions) (KeyPair, error) {
	if err := cert.CheckSignatureFrom(ca.Cert); err != nil {
		return KeyPair{}, fmt.Errorf("renewing certificate %q: not issued by CA %q: %w", cert.Subject.CommonName, ca.Cert.Subject.CommonName, err)
	}
	return ca.issue(&x509.Certificate{
		Subject:     cert.Subject,
		DNSNames:    slices.Clone(cert.DNSNames),
		IPAddresses: slices.Clone(cert.IPAddresses),
		ExtKeyUsage: slices.Clone(cert.ExtKeyUsage),
	}, opts)
}
