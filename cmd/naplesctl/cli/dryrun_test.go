package cli

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/naplesnet/naples/internal/exitstatus"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// networkYAML is a Network with the VNI and subnet.
func networkYAML(name, vni, subnet string) string {
	return "kind: Network\nmeta: {name: " + name + "}\nspec: {vni: " + vni + ", subnet: " + subnet + "}\n"
}

// endpointYAML is an Endpoint of network blue on host-a with the interface, MAC and
// address.
func endpointYAML(name, iface, mac, ip string) string {
	return "kind: Endpoint\nmeta: {name: " + name + "}\nspec: {network: blue, node: host-a, interface: " + iface +
		`, mac: "` + mac + `", ips: [` + ip + "]}\n"
}

// revision returns nimbus's revision.
func (e *env) revision() uint64 {
	e.t.Helper()
	resp, err := e.nimbus.List(e.t.Context(), &nimbusv1.ListRequest{})
	if err != nil {
		e.t.Fatalf("List: %v", err)
	}
	return resp.GetRevision()
}

// TestApplyDryRunServer dry-runs a manifest on the server: the lines say what apply would
// do, as apply's do, and nimbus stores nothing, its revision unmoved; after a real apply,
// a dry run of an edited manifest says which object would be configured at which
// generation, and which left unchanged.
func TestApplyDryRunServer(t *testing.T) {
	e := newEnv(t)
	path := e.file("overlay.yaml", networkYAML("blue", "100", "10.1.0.0/24")+"---\n"+
		endpointYAML("web-a", "web-a", "02:00:00:00:01:0a", "10.1.0.10")+"---\n"+routeYAML("to-dc2", "198.51.100.0/24", "10.10.0.2"))
	equal(t, "apply --dry-run=server of new objects", e.ok("apply", "-f", path, "--dry-run=server"),
		"network/blue created (server dry run)\nendpoint/web-a created (server dry run)\nroute/to-dc2 created (server dry run)\n")
	if n := len(e.names(nimbusv1.Kind_KIND_UNSPECIFIED)); n != 0 || e.revision() != 0 {
		t.Fatalf("after a dry run nimbus holds %d objects at revision %d, want none at 0", n, e.revision())
	}

	e.ok("apply", "-f", path)
	rev := e.revision()
	edited := e.file("edited.yaml", networkYAML("blue", "100", "10.1.0.0/24")+"---\n"+
		endpointYAML("web-a", "web-a", "02:00:00:00:01:0a", "10.1.0.11")+"---\n"+routeYAML("to-dc3", "203.0.113.0/24", "10.10.0.3"))
	equal(t, "apply --dry-run=server of an edit", e.ok("apply", "-f", edited, "--dry-run=server"),
		"network/blue unchanged (server dry run)\nendpoint/web-a configured (generation 2, server dry run)\nroute/to-dc3 created (server dry run)\n")
	if e.revision() != rev || len(e.routes()) != 1 {
		t.Fatalf("after a dry run of an edit: revision %d and routes %q, want %d and [to-dc2]", e.revision(), e.routes(), rev)
	}
}

// TestApplyDryRunServerConflicts checks that a dry run is refused for a cross-object
// conflict with a stored object, and with another object of the manifest, naming the
// object as the real apply does, and that both store nothing.
func TestApplyDryRunServerConflicts(t *testing.T) {
	e := newEnv(t)
	e.ok("apply", "-f", e.file("overlay.yaml", networkYAML("blue", "100", "10.1.0.0/24")+"---\n"+
		endpointYAML("web-a", "web-a", "02:00:00:00:01:0a", "10.1.0.10")))
	rev := e.revision()

	taker := e.file("taker.yaml", endpointYAML("web-b", "web-b", "02:00:00:00:01:0b", "10.1.0.10"))
	line := taker + `: document 1: endpoint/web-b: endpoint "default/web-b": spec.ips "10.1.0.10" is already used by endpoint "default/web-a" in network "blue"`
	dry := e.fails("apply", "-f", taker, "--dry-run=server")
	applied := e.fails("apply", "-f", taker)
	contains(t, "dry run of an endpoint taking web-a's address", dry, "server dry run of "+taker+": document 1 (nothing applied): "+line)
	contains(t, "apply of an endpoint taking web-a's address", applied, line)
	if strings.TrimPrefix(dry.Error(), "server dry run of ") != strings.TrimPrefix(applied.Error(), "applying ") {
		t.Errorf("the dry run's refusal\n%s\ndiffers from the apply's\n%s", dry, applied)
	}

	twins := e.file("twins.yaml", networkYAML("green", "200", "10.2.0.0/24")+"---\n"+networkYAML("red", "200", "10.3.0.0/24"))
	dry = e.fails("apply", "-f", twins, "--dry-run=server")
	contains(t, "dry run of two networks of one VNI", dry,
		twins+`: document 2: network/red: network "default/red": spec.vni "200" is already used by network "default/green"`)
	if e.revision() != rev {
		t.Fatalf("revision %d after refused dry runs and apply, want %d", e.revision(), rev)
	}
}

// TestApplyDryRunClient checks that a client dry run validates without nimbus: it says
// each object is valid, or names the bad field, and needs no server.
func TestApplyDryRunClient(t *testing.T) {
	e := newEnv(t)
	e.vars[ServerEnv] = "unix://" + filepath.Join(e.dir, "nobody.sock")
	path := e.file("routes.yaml", routeYAML("to-dc2", "198.51.100.0/24", "10.10.0.2")+"---\n"+routeYAML("to-dc3", "203.0.113.0/24", "10.10.0.3"))
	equal(t, "apply --dry-run=client", e.ok("apply", "-f", path, "--dry-run=client"),
		"route/to-dc2 valid (client dry run)\nroute/to-dc3 valid (client dry run)\n")
	bad := e.file("bad.yaml", routeYAML("bad", "10.0.0.0/33", "10.10.0.5"))
	contains(t, "client dry run of a bad prefix", e.fails("apply", "-f", bad, "--dry-run=client"),
		bad+": document 1: route/bad: "+`spec.prefix "10.0.0.0/33": prefix length out of range`, "nothing applied")
	// none is apply itself, which needs nimbus.
	contains(t, "apply --dry-run=none without nimbus", e.fails("apply", "-f", path, "--dry-run=none"), "unavailable")
}

// TestApplyDryRunUsage checks that a mode that is none of none, client and server, and a
// dry run with --wait, are usage errors.
func TestApplyDryRunUsage(t *testing.T) {
	e := newEnv(t)
	path := e.file("route.yaml", routeYAML("to-dc2", "198.51.100.0/24", "10.10.0.2"))
	for _, args := range [][]string{
		{"apply", "-f", path, "--dry-run=maybe"},
		{"apply", "-f", path, "--dry-run=server", "--wait"},
	} {
		err := e.fails(args...)
		if exitstatus.Of(err) != exitstatus.Config {
			t.Errorf("naplesctl %q: %v, exit status %d; want a usage error", args, err, exitstatus.Of(err))
		}
	}
	contains(t, "--dry-run=maybe", e.fails("apply", "-f", path, "--dry-run=maybe"), `"maybe"`, "none, client or server")
}
