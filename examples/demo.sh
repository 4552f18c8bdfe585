#!/usr/bin/env bash
# demo.sh: the walking skeleton end to end on one machine. It creates a host network
# namespace, makes a CA and certificates with naplesctl certs, starts nimbus (mutual TLS)
# and a naples agent for that host, applies examples/route.yaml,
# shows the route in the host's kernel and its status at nimbus, deletes it, shows it gone,
# and removes everything it created, also when interrupted.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
bin=${BIN:-$here/../bin}
ns=naples-demo-host-a

if [ "$(id -u)" != 0 ]; then
	echo "demo: needs root to create network namespaces" >&2
	exit 1
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/naples-demo.XXXXXX")
sock="$work/nimbus.sock"
pki="$work/pki"
export NAPLES_SERVER="unix://$sock"
# naplesctl authenticates as the publisher of the demo's CA.
export NAPLES_TLS_CERT="$pki/publisher.crt" NAPLES_TLS_KEY="$pki/publisher.key" NAPLES_TLS_CA="$pki/ca.crt"
pids=()

cleanup() {
	trap - EXIT INT TERM
	for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
	for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
	ip netns delete "$ns" 2>/dev/null || true
	rm -rf "$work"
	echo "== cleaned up: namespace $ns, processes and $work removed"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

step() { printf '\n== %s\n' "$*"; }

# wait_for DESCRIPTION COMMAND...: run COMMAND until it succeeds, for up to 30 seconds.
wait_for() {
	local what=$1
	shift
	for _ in $(seq 300); do
		if "$@" >/dev/null 2>&1; then return 0; fi
		sleep 0.1
	done
	echo "demo: timed out waiting for $what" >&2
	return 1
}

step "creating host namespace $ns with 10.10.0.1/24 on eth0"
ip netns delete "$ns" 2>/dev/null || true
ip netns add "$ns"
ip -n "$ns" link set lo up
ip -n "$ns" link add eth0 type veth peer name eth1
ip -n "$ns" addr add 10.10.0.1/24 dev eth0
ip -n "$ns" link set eth0 up
ip -n "$ns" link set eth1 up

step "naplesctl certs --dir $pki --nodes host-a"
"$bin/naplesctl" certs --dir "$pki" --nodes host-a

step "starting nimbus on $NAPLES_SERVER with TLS"
"$bin/nimbus" --listen "$NAPLES_SERVER" --ephemeral --tls-cert "$pki/nimbus.crt" --tls-key "$pki/nimbus.key" \
	--tls-ca "$pki/ca.crt" 2>"$work/nimbus.log" &
pids+=($!)
wait_for "nimbus to listen" test -S "$sock"

step "starting the naples agent for host-a inside $ns"
ip netns exec "$ns" "$bin/naples-agent" --node host-a --nimbus "$NAPLES_SERVER" \
	--tls-cert "$pki/host-a.crt" --tls-key "$pki/host-a.key" --tls-ca "$pki/ca.crt" \
	--state-dir "$work/state" --socket "$work/agent.sock" 2>"$work/agent.log" &
pids+=($!)

step "naplesctl apply -f examples/route.yaml"
"$bin/naplesctl" apply -f "$here/route.yaml"
wait_for "the route to be PROGRAMMED" sh -c "'$bin/naplesctl' get route to-dc2 -o json | grep -q PHASE_PROGRAMMED"

step "ip -n $ns route show table 100"
ip -n "$ns" route show table 100

step "naplesctl get routes"
"$bin/naplesctl" get routes

step "naplesctl get route to-dc2 -o yaml"
"$bin/naplesctl" get route to-dc2 -o yaml

step "naplesctl delete -f examples/route.yaml"
"$bin/naplesctl" delete -f "$here/route.yaml"
wait_for "the route to leave the kernel" sh -c "! ip -n '$ns' route show table 100 | grep -q 198.51.100.0/24"

step "ip -n $ns route show table 100 (empty)"
ip -n "$ns" route show table 100

step "naplesctl get routes (none)"
"$bin/naplesctl" get routes
