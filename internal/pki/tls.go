package pki

import (
	"crypto/tls"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// ServerConfig returns the tls.Config nimbus serves with: its certificate and key from
// certFile and keyFile, read again when they change (KeyPairFile), TLS 1.3 at least, and a
// verified client certificate issued by a CA of caFile required from every client.
func ServerConfig(certFile, keyFile, caFile string) (*tls.Config, error) {
	kp, err := LoadKeyPairFile(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	return ServerConfigOf(kp, caFile)
}

// ServerConfigOf is ServerConfig with the key pair loaded already.
func ServerConfigOf(kp *KeyPairFile, caFile string) (*tls.Config, error) {
	pool, err := ReadCertPool(caFile)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion:     tls.VersionTLS13,
		GetCertificate: kp.getCertificate,
		ClientAuth:     tls.RequireAndVerifyClientCert,
		ClientCAs:      pool,
	}, nil
}

// ClientConfig returns the tls.Config a client of nimbus dials with: its certificate and
// key from certFile and keyFile, read again when they change (KeyPairFile), TLS 1.3 at
// least, and the server's certificate verified against the CAs of caFile for serverName.
// An empty serverName is DefaultServerName ("nimbus"), which every server certificate
// this package issues carries.
func ClientConfig(certFile, keyFile, caFile, serverName string) (*tls.Config, error) {
	kp, err := LoadKeyPairFile(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	return ClientConfigOf(kp, caFile, serverName)
}

// ClientConfigOf is ClientConfig with the key pair loaded already.
func ClientConfigOf(kp *KeyPairFile, caFile, serverName string) (*tls.Config, error) {
	pool, err := ReadCertPool(caFile)
	if err != nil {
		return nil, err
	}
	if serverName == "" {
		serverName = DefaultServerName
	}
	return &tls.Config{
		MinVersion:           tls.VersionTLS13,
		GetClientCertificate: kp.getClientCertificate,
		RootCAs:              pool,
		ServerName:           serverName,
	}, nil
}

// TransportCredentials returns the gRPC transport credentials of cfg, a config from
// ServerConfig or ClientConfig: TLS with cfg, or plaintext when cfg is nil.
func TransportCredentials(cfg *tls.Config) credentials.TransportCredentials {
	if cfg == nil {
		return insecure.NewCredentials()
	}
	return credentials.NewTLS(cfg)
}

// loadTLSCertificate reads a certificate chain and its key, naming the file at fault.
func loadTLSCertificate(certFile, keyFile string) (tls.Certificate, error) {
	kp, err := LoadKeyPair(certFile, keyFile)
	if err != nil {
		return tls.Certificate{}, err
	}
	// The rest of certFile is the chain the peer needs to reach its CA.
	chain, err := ReadCertificates(certFile)
	if err != nil {
		return tls.Certificate{}, err
	}
	c := tls.Certificate{PrivateKey: kp.Key, Leaf: kp.Cert}
	for _, cert := range chain {
		c.Certificate = append(c.Certificate, cert.Raw)
	}
	return c, nil
}
