package cli

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/naplesnet/naples/agent"
	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/hal/linux"
	"github.com/naplesnet/naples/internal/address"
	"github.com/naplesnet/naples/internal/testns"
	delphiv1 "github.com/naplesnet/naples/proto/delphi/v1"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// TestDataplaneCommandKernel runs naplesctl dataplane against the real local API of a
// node whose namespace holds a network's bridge and VXLAN device, made by ip as the
// overlay's reconcilers make them, and a remote endpoint's entries; it deletes the
// endpoint's FDB entry by hand and sees it reported missing.
func TestDataplaneCommandKernel(t *testing.T) {
	ns := testns.Named(t, "naples-ctl-dp")
	nsh := testns.Handle(t, ns)
	id := nimbusv1.NewKey(nimbusv1.Kind_KIND_NETWORK, "", "", "blue").ID()
	br, vx := linux.BridgeName(id), linux.VXLANName(id)
	ip := func(args ...string) { testns.Run(t, "ip", append([]string{"-n", ns}, args...)...) }
	bridge := func(args ...string) { testns.Run(t, "bridge", append([]string{"-n", ns}, args...)...) }
	ip("link", "add", br, "type", "bridge")
	ip("link", "set", br, "alias", linux.OwnerAlias(id), "address", linux.GatewayMAC(id).String(), "up")
	ip("addr", "add", "10.1.0.1/24", "dev", br, "noprefixroute")
	ip("link", "add", vx, "type", "vxlan", "id", "100", "local", "192.0.2.1", "dstport", "4789", "nolearning")
	ip("link", "set", vx, "alias", linux.OwnerAlias(id), "master", br, "up")
	bridge("fdb", "append", "00:00:00:00:00:00", "dev", vx, "dst", "192.0.2.2", "self", "permanent")
	bridge("fdb", "add", "02:00:00:00:00:02", "dev", vx, "dst", "192.0.2.2", "self", "static")
	bridge("fdb", "add", "02:00:00:00:00:02", "dev", vx, "master", "static")
	ip("neigh", "replace", "10.1.0.3", "lladdr", "02:00:00:00:00:02", "dev", br, "nud", "permanent")

	e := newEnv(t)
	store, err := delphi.Open(delphi.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	desired, err := store.ClaimDesired()
	if err != nil {
		t.Fatal(err)
	}
	txn := &delphi.DesiredTxn{}
	for _, o := range []*nimbusv1.Object{
		{Meta: &nimbusv1.ObjectMeta{Name: "host-a"}, Spec: &nimbusv1.Object_Node{Node: &nimbusv1.NodeSpec{VtepAddress: "192.0.2.1"}}},
		{Meta: &nimbusv1.ObjectMeta{Name: "host-b"}, Spec: &nimbusv1.Object_Node{Node: &nimbusv1.NodeSpec{VtepAddress: "192.0.2.2"}}},
		{Meta: &nimbusv1.ObjectMeta{Name: "blue", Generation: 1},
			Spec: &nimbusv1.Object_Network{Network: &nimbusv1.NetworkSpec{Vni: 100, Subnet: "10.1.0.0/24", Gateway: "10.1.0.1"}}},
		{Meta: &nimbusv1.ObjectMeta{Name: "db", Generation: 1},
			Spec: &nimbusv1.Object_Endpoint{Endpoint: &nimbusv1.EndpointSpec{Network: "blue", Node: "host-b", Mac: "02:00:00:00:00:02", Ips: []string{"10.1.0.3"}}}},
	} {
		txn.Put(o)
	}
	if err := desired.Commit(txn); err != nil {
		t.Fatal(err)
	}
	insp, err := agent.NewInspector(agent.InspectorOptions{Store: store, Logger: slog.New(slog.DiscardHandler), Node: "host-a", Namespace: &nsh})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(e.dir, "agent.sock")
	ctx, cancel := context.WithCancel(context.Background())
	lis, err := address.Address{Network: "unix", Addr: sock}.Listen(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- insp.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-served:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Error("Serve did not return")
		}
	})
	e.vars[AgentEnv] = sock

	out := e.ok("dataplane")
	for _, want := range []string{
		"node host-a, vtep 192.0.2.1\n",
		"network default/default/blue: vni 100, no status yet\n",
		"  bridge " + br + ": ok; up, mtu 1500, mac " + linux.GatewayMAC(id).String() + ", addresses 10.1.0.1/24",
		"  vxlan " + vx + ": ok; up, mtu 1500, vni 100, local 192.0.2.1, dstport 4789, master " + br + "\n",
		"  remote vtep 192.0.2.2 (host-b): ok\n",
		"  endpoint db on host-b (vtep 192.0.2.2): no status yet\n" +
			"    fdb 02:00:00:00:00:02 dst 192.0.2.2: ok\n" +
			"    neighbour 10.1.0.3 lladdr 02:00:00:00:00:02: ok\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("dataplane does not contain %q:\n%s", want, out)
		}
	}

	bridge("fdb", "del", "02:00:00:00:00:02", "dev", vx, "dst", "192.0.2.2", "self")
	out = e.ok("dataplane")
	if want := "    fdb 02:00:00:00:00:02 dst 192.0.2.2: WRONG: no entry on the vxlan device\n"; !strings.Contains(out, want) {
		t.Errorf("dataplane after deleting the FDB entry does not contain %q:\n%s", want, out)
	}
	bridge("fdb", "del", "02:00:00:00:00:02", "dev", vx, "master")
	out = e.ok("dataplane", "-o", "json")
	var doc delphiv1.DataplaneResponse
	if err := protojson.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("dataplane -o json: %v\n%s", err, out)
	}
	if f := doc.GetNetworks()[0].GetEndpoints()[0].GetFdb(); f.GetPresent() || f.GetBridgePresent() || len(f.GetDsts()) != 0 {
		t.Errorf("dataplane -o json after deleting both FDB entries: fdb %v", f)
	}
}
