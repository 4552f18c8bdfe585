// Package pki makes and loads the certificates naples speaks mutual TLS with: a
// self-signed certificate authority, the certificates it issues to nimbus, to nodes and to
// publishers, and the tls.Config of the server and of its clients.
//
// # Identities
//
// Who a peer is follows from the Organization of its verified certificate:
//
//   - "naples:node" ([OrganizationNode]): a node, the host running a naples agent, named by
//     the CommonName (or, when that is empty, by its single DNS name). The name is a node
//     name as nimbus knows it, such as "host-a".
//   - "naples:publisher" ([OrganizationPublisher]): a publisher, a controller or an operator
//     with naplesctl, named by the CommonName.
//   - "naples:replica" ([OrganizationReplica]): a nimbus replica, named by the CommonName,
//     its replica name; it pushes what its agents report to the other replicas.
//
// A certificate that claims more than one of them, or none, names no identity. [IdentityOf] reads the
// identity of a certificate; nimbus decides what each identity may do.
//
// # Certificates
//
// Keys are ECDSA P-256. The CA is valid for ten years by default and issues certificates
// valid for five, never beyond its own expiry. Node and publisher certificates are for
// client authentication only. The server certificate is for server authentication and
// always names [DefaultServerName] ("nimbus"), "localhost", 127.0.0.1 and ::1 besides the
// hosts it is issued for, so clients reaching nimbus over a unix socket or a loopback
// address verify it with ServerName "nimbus", the default of [ClientConfig]. A replica
// certificate is both: the server certificate of one nimbus replica, with the same names
// and the replica's name besides, and its client certificate towards the other replicas.
//
// Certificates and keys are stored in PEM files: certificates as CERTIFICATE blocks, keys
// as PKCS #8 PRIVATE KEY blocks in files of mode 0600.
package pki
