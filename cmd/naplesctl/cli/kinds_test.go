package cli

import (
	"errors"
	"testing"

	"github.com/naplesnet/naples/internal/exitstatus"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// TestAPIResources checks api-resources' table, wide table and names against their
// golden output.
func TestAPIResources(t *testing.T) {
	e := newEnv(t)
	equal(t, "api-resources", e.ok("api-resources"), `NAME                      SHORTNAMES   KIND
nodes                     no           Node
networks                  net          Network
endpoints                 ep           Endpoint
securitygroups            sg           SecurityGroup
networksecuritypolicies   nsp          NetworkSecurityPolicy
routes                    rt           Route
interfaces                if           Interface
flowexportpolicies        fep          FlowExportPolicy
traces                    tr           Trace
`)
	equal(t, "api-resources -o wide", e.ok("api-resources", "-o", "wide"), `NAME                      SHORTNAMES   KIND                    FIELDS
nodes                     no           Node                    hostname,vtepAddress
networks                  net          Network                 vni,subnet,gateway,mtu,subnets
endpoints                 ep           Endpoint                network,node,interface,mac,ips,securityGroups,allowedSourcePrefixes
securitygroups            sg           SecurityGroup           cidrs
networksecuritypolicies   nsp          NetworkSecurityPolicy   attachGroups,ingress,egress
routes                    rt           Route                   table,prefix,nexthops,metric,tenantTable
interfaces                if           Interface               device,adminUp,mtu,addresses
flowexportpolicies        fep          FlowExportPolicy        endpoints,securityGroups,verdicts,format,targets,file,interval,templateInterval,sampling
traces                    tr           Trace                   source,destination,destinationAddress,protocol,sourcePort,destinationPort,payloadSize,live,timeout,family
`)
	equal(t, "api-resources -o name", e.ok("api-resources", "-o", "name"), `nodes
networks
endpoints
securitygroups
networksecuritypolicies
routes
interfaces
flowexportpolicies
traces
`)
	err := e.fails("api-resources", "-o", "json")
	contains(t, "api-resources -o json", err, `--output "json"`, "wide or name")
	if exitstatus.Of(err) != 2 {
		t.Errorf("api-resources -o json: exit status %d, want 2 (usage)", exitstatus.Of(err))
	}
}

// TestShortKindNames checks that get, describe and delete take short kind names, and
// that a manifest may name its kind by one.
func TestShortKindNames(t *testing.T) {
	e := newEnv(t)
	equal(t, "apply", e.ok("apply", "-f", e.file("r.yaml", routeYAML("a", "192.0.2.0/24", "10.0.0.1"))), "route/a created\n")
	equal(t, "apply of kind rt", e.ok("apply", "-f", e.file("rt.yaml", "kind: rt\nmeta: {name: b, nodes: [host-a]}\nspec: {table: 100, prefix: 192.0.2.128/25, nexthops: [{gateway: 10.0.0.1}]}\n")), "route/b created\n")
	if got, want := e.ok("get", "rt", "a"), e.ok("get", "route", "a"); got != want {
		t.Errorf("get rt a:\n%s\nwant, as get route a:\n%s", got, want)
	}
	if got, want := e.ok("get", "RT"), e.ok("get", "routes"); got != want {
		t.Errorf("get RT:\n%s\nwant, as get routes:\n%s", got, want)
	}
	if got, want := e.ok("describe", "rt", "b"), e.ok("describe", "route", "b"); got != want {
		t.Errorf("describe rt b:\n%s\nwant, as describe route b:\n%s", got, want)
	}
	equal(t, "delete rt a", e.ok("delete", "rt", "a"), "route/a deleted\n")
	if got := e.routes(); len(got) != 1 || got[0] != "b" {
		t.Errorf("routes after delete rt a: %q, want [b]", got)
	}
	err := e.fails("get", "rts")
	if !errors.Is(err, nimbusv1.ErrUnknownKind) || exitstatus.Of(err) != 2 {
		t.Errorf("get rts: %v (exit status %d), want a usage error", err, exitstatus.Of(err))
	}
}
