package pki

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"time"
)

// DefaultExpiryWarning is how long before a certificate expires the processes warn of it
// by default: 30 days.
const DefaultExpiryWarning = 30 * 24 * time.Hour

// What a certificate file is to the process that uses it, the values of CertFile.Use.
const (
	// UseServer is the certificate a process serves with.
	UseServer = "server"
	// UseClient is the certificate a process presents to the server it dials.
	UseClient = "client"
	// UseCA is a file of CA certificates a process verifies its peers with.
	UseCA = "ca"
)

// CertFile is a certificate file a process uses, and what it is to the process.
type CertFile struct {
	// Use is UseServer, UseClient or UseCA.
	Use string
	// Path is the PEM file's path.
	Path string
}

// ExpiringCert is when the certificates of one file expire.
type ExpiringCert struct {
	CertFile
	// NotAfter is the earliest NotAfter of the file's certificates: for a certificate
	// file, its own (the chain after it expires no earlier in practice); for a CA file,
	// the first of its CAs to expire.
	NotAfter time.Time
}

// Expiry is when the certificates a process loaded expire. It holds what the files held
// when ReadExpiry read them, which is what the process uses until it loads them again
// (Renewed).
type Expiry struct {
	mu       sync.Mutex
	certs    []ExpiringCert
	onChange []func()
}

// ReadExpiry reads the certificate files a process uses. Its error names the file that
// cannot be read.
func ReadExpiry(files ...CertFile) (*Expiry, error) {
	e := &Expiry{}
	for _, f := range files {
		certs, err := ReadCertificates(f.Path)
		if err != nil {
			return nil, err
		}
		notAfter := certs[0].NotAfter
		if f.Use == UseCA {
			for _, c := range certs[1:] {
				if c.NotAfter.Before(notAfter) {
					notAfter = c.NotAfter
				}
			}
		}
		e.certs = append(e.certs, ExpiringCert{CertFile: f, NotAfter: notAfter})
	}
	return e, nil
}

// Certificates returns the files read, in the order given to ReadExpiry.
func (e *Expiry) Certificates() []ExpiringCert {
	if e == nil {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.certs)
}

// Renewed records that the process loaded the certificate of the file path again, which
// expires at notAfter, and calls the functions of OnChange. A nil Expiry ignores it.
func (e *Expiry) Renewed(path string, notAfter time.Time) {
	if e == nil {
		return
	}
	e.mu.Lock()
	for i := range e.certs {
		if e.certs[i].Path == path && e.certs[i].Use != UseCA {
			e.certs[i].NotAfter = notAfter
		}
	}
	callbacks := e.onChange
	e.mu.Unlock()
	for _, f := range callbacks {
		f()
	}
}

// OnChange calls f after each Renewed from then on. A nil Expiry never calls it.
func (e *Expiry) OnChange(f func()) {
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.onChange = append(e.onChange, f)
}

// Warnings returns a line for each file whose certificate expires within the duration
// after now, or has expired:
//
//	warning: certificate /etc/naples/pki/node.crt expires in 12 days (2027-01-01T00:00:00Z)
//	warning: certificate /etc/naples/pki/node.crt expired 3 days ago (2026-11-25T00:00:00Z)
//
// A nil Expiry has none.
func (e *Expiry) Warnings(now time.Time, within time.Duration) []string {
	var lines []string
	for _, c := range e.Certificates() {
		left := c.NotAfter.Sub(now)
		if left > within {
			continue
		}
		at := c.NotAfter.UTC().Format(time.RFC3339)
		if left < 0 {
			lines = append(lines, fmt.Sprintf("warning: certificate %s expired %s ago (%s)", c.Path, days(-left), at))
		} else {
			lines = append(lines, fmt.Sprintf("warning: certificate %s expires in %s (%s)", c.Path, days(left), at))
		}
	}
	return lines
}

// days returns d in whole days, rounded down: "1 day", "12 days".
func days(d time.Duration) string {
	n := int64(math.Floor(d.Hours() / 24))
	if n == 1 {
		return "1 day"
	}
	return fmt.Sprintf("%d days", n)
}
