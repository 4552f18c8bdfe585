package linux

import (
	"net"
	"strings"
	"testing"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// TestOverlayNames checks the names and marks of the overlay's kernel objects: derived
// from the key ID alone, the same for the same network, different for different ones,
// short enough for the kernel, and recognisable as naples's.
func TestOverlayNames(t *testing.T) {
	blue := nimbusv1.NewKey(nimbusv1.Kind_KIND_NETWORK, "", "", "blue").ID()
	red := nimbusv1.NewKey(nimbusv1.Kind_KIND_NETWORK, "acme", "", "blue").ID()
	for _, name := range []string{BridgeName(blue), VXLANName(blue), BridgeName(red), VXLANName(red)} {
		if len(name) > 15 {
			t.Errorf("device name %q is %d characters; the kernel takes 15", name, len(name))
		}
	}
	if BridgeName(blue) != BridgeName(blue) || BridgeName(blue) == BridgeName(red) || BridgeName(blue) == VXLANName(blue) {
		t.Errorf("names %s %s %s: want stable per network, distinct across networks and devices",
			BridgeName(blue), BridgeName(red), VXLANName(blue))
	}
	if !strings.HasPrefix(BridgeName(blue), bridgePrefix) || !strings.HasPrefix(VXLANName(blue), vxlanPrefix) {
		t.Errorf("names %s %s lack their prefixes", BridgeName(blue), VXLANName(blue))
	}
	if owner, ok := OwnerOfAlias(OwnerAlias(blue)); !ok || owner != blue {
		t.Errorf("OwnerOfAlias(OwnerAlias(%s)) = %q, %v", blue, owner, ok)
	}
	if _, ok := OwnerOfAlias("uplink to rack 3"); ok {
		t.Errorf("a foreign alias reads as naples's")
	}

	mac := GatewayMAC(blue)
	if len(mac) != 6 || mac[0]&0x01 != 0 || mac[0]&0x02 == 0 {
		t.Errorf("GatewayMAC = %s; want a unicast, locally administered Ethernet address", mac)
	}
	if GatewayMAC(blue).String() != mac.String() || GatewayMAC(red).String() == mac.String() {
		t.Errorf("GatewayMAC: want stable per network and distinct across networks")
	}
	if _, err := net.ParseMAC(mac.String()); err != nil {
		t.Errorf("GatewayMAC %s does not parse: %v", mac, err)
	}

	for _, tenant := range []string{"", "default", "acme"} {
		if table := TenantTable(tenant); table < TenantTableBase || table > TenantTableBase+0xFFFFFF {
			t.Errorf("TenantTable(%q) = %#x, outside [%#x, %#x]", tenant, table, TenantTableBase, TenantTableBase+0xFFFFFF)
		}
	}
	if TenantTable("") != TenantTable("default") || TenantTable("acme") == TenantTable("default") {
		t.Errorf("TenantTable: the empty tenant is the default one, and tenants differ")
	}
}
