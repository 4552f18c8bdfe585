// Package ipfix encodes flow records as IPFIX messages (RFC 7011) for export over UDP.
//
// An Encoder writes the messages of one transport session, one collector: each message
// has the RFC 7011 header (version 10, length, export time, the sequence number of its
// first data record, the observation domain) and sets of one of the two templates this
// package defines, TemplateIPv4 and TemplateIPv6, or the template set that defines them.
// A Record is one direction of a connection (RFC 5102 unidirectional flows, as every
// collector decodes them), with the standard information elements for its addresses,
// ports, protocol, times, end reason and delta counts, and enterprise elements of
// EnterpriseNumber for the firewall's verdict, the rule that decided and the names of the
// policy, rule and endpoint. docs/flows.md lists the templates.
package ipfix
