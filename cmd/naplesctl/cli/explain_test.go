package cli

import (
	"errors"
	"testing"

	"github.com/naplesnet/naples/internal/exitstatus"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// TestExplain checks explain's output for a kind, a field holding a message, an enum
// field, a duration and a field of meta against their golden output: the comments of
// nimbus.proto, read from the generated comments.
func TestExplain(t *testing.T) {
	e := newEnv(t)
	route := `KIND:     Route
NAMES:    route, routes, rt
SPEC:     RouteSpec

DESCRIPTION:
    RouteSpec is a route in a policy-routing table of the node's kernel.

FIELDS:
    table <uint32>
        table is the kernel routing table id (1..4294967295, not 255 "local"); 0 with
        tenant_table.

    prefix <string>
        prefix is the destination in CIDR form with no host bits set.

    nexthops <[]NextHop>
        nexthops lists one or more next hops; more than one makes an ECMP route.

    metric <uint32>
        metric is the route priority; 0 is the kernel default.

    tenantTable <bool>
        tenant_table puts the route in the policy-routing table of the object's tenant, the
        one its networks route in (traffic entering from them), instead of table, which must
        then be 0.
`
	equal(t, "explain route", e.ok("explain", "route"), route)
	equal(t, "explain rt.spec", e.ok("explain", "rt.spec"), route)
	nexthops := `KIND:     Route
FIELD:    nexthops <[]NextHop>

DESCRIPTION:
    nexthops lists one or more next hops; more than one makes an ECMP route.

    NextHop is one next hop of a route.

FIELDS:
    gateway <string>
        gateway is the next hop's address, of the same family as the prefix.

    device <string>
        device optionally names the outgoing interface.

    weight <uint32>
        weight is the ECMP weight, 1..256; 0 means 1.
`
	equal(t, "explain rt.nexthops", e.ok("explain", "rt.nexthops"), nexthops)
	equal(t, "explain Routes.spec.NextHops", e.ok("explain", "Routes.spec.NextHops"), nexthops)
	equal(t, "explain rt.nexthops.weight", e.ok("explain", "rt.nexthops.weight"), `KIND:     Route
FIELD:    nexthops.weight <uint32>

DESCRIPTION:
    weight is the ECMP weight, 1..256; 0 means 1.
`)
	equal(t, "explain rt.tenant_table", e.ok("explain", "rt.tenant_table"), `KIND:     Route
FIELD:    tenantTable <bool>

DESCRIPTION:
    tenant_table puts the route in the policy-routing table of the object's tenant, the
    one its networks route in (traffic entering from them), instead of table, which must
    then be 0.
`)
	equal(t, "explain nsp.ingress.action", e.ok("explain", "nsp.ingress.action"), `KIND:     NetworkSecurityPolicy
FIELD:    ingress.action <Action>

DESCRIPTION:
    <no description>

VALUES:
    ACTION_UNSPECIFIED
    ACTION_ALLOW
    ACTION_DENY
`)
	equal(t, "explain fep.templateInterval", e.ok("explain", "fep.templateInterval"), `KIND:     FlowExportPolicy
FIELD:    templateInterval <duration>

DESCRIPTION:
    template_interval is how often the IPFIX templates are sent again to every target,
    so that a collector that restarts learns them (RFC 7011 8.4); a target that
    failed gets them again with the first message that goes through. 1s to 1h; unset:
    600s.
`)
	equal(t, "explain rt.meta.labels", e.ok("explain", "rt.meta.labels"), `KIND:     Route
FIELD:    meta.labels <map[string]string>

DESCRIPTION:
    <no description>
`)
}

// TestExplainEveryField checks that explain describes every kind and every field of
// every kind's spec, as deep as the messages go.
func TestExplainEveryField(t *testing.T) {
	e := newEnv(t)
	for _, k := range nimbusv1.Kinds() {
		e.ok("explain", k.ShortName())
		var walk func(path string, fields []string)
		walk = func(path string, fields []string) {
			for _, f := range fields {
				p := path + "." + f
				ex, err := resolveExplain(p)
				if err != nil {
					t.Errorf("explain %s: %v", p, err)
					continue
				}
				e.ok("explain", p)
				if len(p) < 200 { // messages that hold themselves end here
					walk(p, fieldNames(ex.md))
				}
			}
		}
		walk(kindArg(k), specFieldNames(k))
	}
}

func TestExplainErrors(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		arg   string
		parts []string
		is    error
	}{
		{arg: "rout", parts: []string{`kind "rout": unknown kind`}, is: nimbusv1.ErrUnknownKind},
		{arg: "rt.tabel", parts: []string{`explain "rt.tabel": route has no field "tabel"`, "(fields: table, prefix, nexthops, metric, tenantTable)"}},
		{arg: "rt.nexthops.gw", parts: []string{`route.nexthops has no field "gw" (fields: gateway, device, weight)`}},
		{arg: "rt.prefix.length", parts: []string{`route.prefix is of type string, which has no field "length"`}},
		{arg: "rt..prefix", parts: []string{"empty field name after route"}},
		{arg: "rt.prefix.", parts: []string{"empty field name after route.prefix"}},
		{arg: "rt.status", parts: []string{`route has no field "status"`}},
	} {
		t.Run(tc.arg, func(t *testing.T) {
			err := e.fails("explain", tc.arg)
			contains(t, "explain "+tc.arg, err, tc.parts...)
			if exitstatus.Of(err) != 2 {
				t.Errorf("exit status %d, want 2 (usage)", exitstatus.Of(err))
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("error %v is not %v", err, tc.is)
			}
		})
	}
}
