#!/usr/bin/env bash
# demo.sh: naples end to end on one machine, in network namespaces.
#
# Part 1, the overlay: two hosts, host-a and host-b, joined by an underlay (a namespace
# with a bridge), each with a workload namespace attached by a veth. It makes a CA and
# certificates with naplesctl certs, starts nimbus (mutual TLS) and an agent per host,
# applies examples/overlay.yaml (two Nodes, the Network blue, an Endpoint per workload),
# shows the status at nimbus and each host's dataplane, sends a TCP message from one
# workload to the other across VXLAN, deletes everything and shows the hosts clean.
#
# Part 2, a route: applies examples/route.yaml to host-a, shows the route in its kernel and
# its status at nimbus, deletes it and shows it gone.
#
# Part 3, traces: applies the overlay and the firewall again and follows two packets from
# web-a to web-b with naplesctl trace, hop by hop across both hosts: TCP 8080, which the
# firewall lets through, and TCP 9090, which web-b's ingress policy drops.
#
# Everything it created is removed when it exits, also when interrupted.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
bin=${BIN:-$here/../bin}

# The namespaces: the underlay, the two hosts and a workload on each.
underlay=naples-demo-underlay
host_a=naples-demo-host-a
host_b=naples-demo-host-b
web_a=naples-demo-web-a
web_b=naples-demo-web-b
namespaces=("$web_a" "$web_b" "$host_a" "$host_b" "$underlay")

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
# Each host's firewall pins its maps and links in a directory of its own on a bpffs of the
# demo's (not /sys/fs/bpf: `ip netns exec` mounts a /sys of its own for every agent).
bpfroot="$work/bpf"
mkdir "$bpfroot"
mount -t bpf bpf "$bpfroot"

# cleanup stops every process the demo started and removes its namespaces and files.
cleanup() {
	local status=$?
	trap - EXIT INT TERM
	for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
	for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
	for ns in "${namespaces[@]}"; do ip netns delete "$ns" 2>/dev/null || true; done
	umount -l "$bpfroot" 2>/dev/null || true
	rm -rf "$work"
	printf '\n== cleaned up: namespaces %s, processes and %s removed\n' "${namespaces[*]}" "$work"
	exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

n=0
# step prints the next numbered step's title.
step() {
	n=$((n + 1))
	printf '\n== %d. %s\n' "$n" "$*"
}

# show_logs prints the end of the logs of nimbus and the agents, to see why the demo failed.
show_logs() {
	local log
	for log in "$work"/*.log; do
		[ -s "$log" ] || continue
		printf '\n== the end of %s:\n' "${log##*/}" >&2
		tail -n 15 "$log" >&2
	done
}

# wait_for DESCRIPTION COMMAND...: run COMMAND until it succeeds, for up to 30 seconds.
wait_for() {
	local what=$1
	shift
	for _ in $(seq 300); do
		if "$@" >/dev/null 2>&1; then return 0; fi
		sleep 0.1
	done
	echo "demo: timed out waiting for $what" >&2
	show_logs
	return 1
}

# apply_wait FILE: naplesctl apply -f FILE --wait, without the progress lines --wait
# writes to stderr at every change (its errors still show).
apply_wait() {
	{ "$bin/naplesctl" apply -f "$1" --wait --timeout 60s 2>&1 1>&3 |
		sed '/: [0-9]*\/[0-9]* nodes programmed (generation [0-9]*)$/d' >&2; } 3>&1
}

# add_host NS NODE VTEP: make the host namespace of NODE with an uplink to the underlay
# bridge carrying its VTEP address.
add_host() {
	local ns=$1 node=$2 vtep=$3
	ip netns add "$ns"
	ip -n "$ns" link set lo up
	ip -n "$underlay" link add "up-$node" type veth peer name uplink netns "$ns"
	ip -n "$underlay" link set "up-$node" master fabric up
	ip -n "$ns" addr add "$vtep/24" dev uplink
	ip -n "$ns" link set uplink up
}

# add_workload NS HOSTNS NAME MAC IP: make the workload namespace NS with eth0 (MAC, IP/24)
# whose peer in the host namespace HOSTNS is named NAME, the Endpoint's interface.
add_workload() {
	local ns=$1 hostns=$2 name=$3 mac=$4 ip=$5
	ip netns add "$ns"
	ip -n "$ns" link set lo up
	ip -n "$hostns" link add "$name" type veth peer name eth0 netns "$ns"
	ip -n "$ns" link set eth0 address "$mac"
	ip -n "$ns" addr add "$ip/24" dev eth0
	ip -n "$ns" link set eth0 up
	ip -n "$ns" route add default via 10.1.0.1
}

# start_agent NS NODE: start the agent of NODE inside its host namespace, with its local
# API on $work/NODE.sock.
start_agent() {
	local ns=$1 node=$2
	ip netns exec "$ns" "$bin/naples-agent" --node "$node" --nimbus "$NAPLES_SERVER" \
		--tls-cert "$pki/$node.crt" --tls-key "$pki/$node.key" --tls-ca "$pki/ca.crt" \
		--state-dir "$work/state-$node" --socket "$work/$node.sock" --bpf-dir "$bpfroot/$node" --fw-stats-interval 1s \
		2>"$work/agent-$node.log" &
	pids+=($!)
}

# clean NS: succeed when the host namespace holds nothing of naples's: no device naples
# made (their alias starts with "naples:"), no port on a naples bridge, no naples rule.
clean() {
	local ns=$1 links rules
	links=$(ip -n "$ns" -d link show)
	rules=$(ip -n "$ns" rule show; ip -n "$ns" -6 rule show)
	! grep -q -e 'naples:' -e 'master nbr' <<<"$links" && ! grep -q 'iif nbr' <<<"$rules"
}

echo "Part 1: an overlay network across two hosts"

step "underlay $underlay with bridge fabric; hosts with uplinks: host-a 192.168.100.1, host-b 192.168.100.2"
for ns in "${namespaces[@]}"; do ip netns delete "$ns" 2>/dev/null || true; done
ip netns add "$underlay"
ip -n "$underlay" link add fabric type bridge
ip -n "$underlay" link set fabric up
add_host "$host_a" host-a 192.168.100.1
add_host "$host_b" host-b 192.168.100.2
# host-a also gets a veth pair with 10.10.0.1/24, the next hop of part 2's route.
ip -n "$host_a" link add eth0 type veth peer name eth1
ip -n "$host_a" addr add 10.10.0.1/24 dev eth0
ip -n "$host_a" link set eth0 up
ip -n "$host_a" link set eth1 up

step "workloads: web-a 10.1.0.10 on host-a, web-b 10.1.0.11 on host-b (veths named web-a, web-b in the hosts)"
add_workload "$web_a" "$host_a" web-a 02:00:00:00:01:0a 10.1.0.10
add_workload "$web_b" "$host_b" web-b 02:00:00:00:01:0b 10.1.0.11

step "naplesctl certs --dir $pki --nodes host-a,host-b"
"$bin/naplesctl" certs --dir "$pki" --nodes host-a,host-b

step "starting nimbus on $NAPLES_SERVER with TLS, and an agent in each host"
"$bin/nimbus" --listen "$NAPLES_SERVER" --ephemeral --tls-cert "$pki/nimbus.crt" --tls-key "$pki/nimbus.key" \
	--tls-ca "$pki/ca.crt" 2>"$work/nimbus.log" &
pids+=($!)
wait_for "nimbus to listen" test -S "$sock"
start_agent "$host_a" host-a
start_agent "$host_b" host-b

step "naplesctl apply -f examples/overlay.yaml --wait"
apply_wait "$here/overlay.yaml"

step "naplesctl get networks; naplesctl get endpoints"
"$bin/naplesctl" get networks
"$bin/naplesctl" get endpoints

step "naplesctl describe endpoint web-b"
"$bin/naplesctl" describe endpoint web-b

step "naplesctl --agent host-a.sock dataplane"
"$bin/naplesctl" --agent "$work/host-a.sock" dataplane

step "naplesctl --agent host-b.sock dataplane"
"$bin/naplesctl" --agent "$work/host-b.sock" dataplane

step "TCP across VXLAN: a server in web-b on 10.1.0.11:8080, a client in web-a"
ip netns exec "$web_b" python3 -c '
import socket
with socket.create_server(("0.0.0.0", 8080)) as s:
    s.settimeout(60)
    c, peer = s.accept()
    with c:
        c.settimeout(10)
        got = c.recv(1024).decode()
        print(f"web-b: received {got!r} from {peer[0]}", flush=True)
        c.sendall(b"hello web-a, this is web-b")
' &
server=$!
pids+=("$server")
ip netns exec "$web_a" python3 -c '
import socket, sys, time
deadline = time.monotonic() + 30
while True:
    try:
        c = socket.create_connection(("10.1.0.11", 8080), timeout=2)
        break
    except OSError as e:
        if time.monotonic() > deadline:
            sys.exit(f"web-a: cannot connect to 10.1.0.11:8080: {e}")
        time.sleep(0.1)  # the server may not listen yet
with c:
    c.settimeout(10)
    c.sendall(b"hello web-b, this is web-a")
    got = b""
    while chunk := c.recv(1024):
        got += chunk
    print(f"web-a: received {got.decode()!r} from 10.1.0.11", flush=True)
    if got != b"hello web-a, this is web-b":
        sys.exit("web-a: wrong reply")
'
wait "$server"

step "the exchange went through the tunnel: ip -n $host_a -s link show type vxlan"
ip -n "$host_a" -s link show type vxlan

step "naplesctl apply -f examples/firewall.yaml --wait: web-b serves TCP 8080 to the group client only"
apply_wait "$here/firewall.yaml"

step "web-b listens on 8080 and 9090; web-a connects to both: 8080 is allowed, 9090 is dropped"
ip netns exec "$web_b" python3 -c '
import socket, threading
def serve(port):
    with socket.create_server(("0.0.0.0", port)) as s:
        s.settimeout(30)
        c, _ = s.accept()
        with c:
            c.sendall(b"hello from web-b:%d" % port)
for p in (8080, 9090):
    threading.Thread(target=serve, args=(p,), daemon=True).start()
threading.Event().wait(30)
' &
server=$!
pids+=("$server")
ip netns exec "$web_a" python3 -c '
import socket, sys, time
def connect(port, timeout):
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("10.1.0.11", port), timeout=1) as c:
                c.settimeout(5)
                return c.recv(1024).decode()
        except OSError as e:
            if time.monotonic() > deadline:
                return e
            time.sleep(0.1)
got = connect(8080, 20)
print(f"web-a -> 10.1.0.11:8080: {got!r}", flush=True)
if not isinstance(got, str):
    sys.exit("web-a: 8080 should be allowed")
got = connect(9090, 2)
print(f"web-a -> 10.1.0.11:9090: {got}", flush=True)
if isinstance(got, str):
    sys.exit("web-a: 9090 should be dropped by the firewall")
'
kill "$server" 2>/dev/null || true

step "the rule's hits at nimbus: naplesctl describe networksecuritypolicy web-ingress"
wait_for "host-b to report the rule's hits" sh -c "'$bin/naplesctl' describe networksecuritypolicy web-ingress | grep -q 'ingress\[0\].packets.*[1-9]'"
"$bin/naplesctl" describe networksecuritypolicy web-ingress

step "naplesctl --agent host-b.sock bpf policy: the firewall's maps on host-b"
"$bin/naplesctl" --agent "$work/host-b.sock" bpf policy

step "naplesctl --agent host-b.sock flows --to 10.1.0.11: what host-b's firewall saw of web-a's connections"
wait_for "host-b to show the denied connection's flow" sh -c "'$bin/naplesctl' --agent '$work/host-b.sock' flows --to 10.1.0.11 --verdict denied | grep -q ':9090'"
"$bin/naplesctl" --agent "$work/host-b.sock" flows --to 10.1.0.11

step "naplesctl delete -f examples/firewall.yaml"
"$bin/naplesctl" delete -f "$here/firewall.yaml"

step "naplesctl delete -f examples/overlay.yaml"
"$bin/naplesctl" delete -f "$here/overlay.yaml"
wait_for "host-a to be clean" clean "$host_a"
wait_for "host-b to be clean" clean "$host_b"

step "the hosts are clean: no bridge, no VXLAN device; the workloads' veths stay, detached (ip -br link)"
for ns in "$host_a" "$host_b"; do
	echo "$ns:"
	ip -n "$ns" -br link | sed 's/^/  /'
done

step "naplesctl get networks (none)"
"$bin/naplesctl" get networks

echo
echo "Part 2: a policy route on host-a"

step "naplesctl apply -f examples/route.yaml --wait"
apply_wait "$here/route.yaml"

step "ip -n $host_a route show table 100"
ip -n "$host_a" route show table 100

step "naplesctl get routes"
"$bin/naplesctl" get routes

step "naplesctl delete -f examples/route.yaml"
"$bin/naplesctl" delete -f "$here/route.yaml"
wait_for "the route to leave the kernel" sh -c "! ip -n '$host_a' route show table 100 | grep -q 198.51.100.0/24"

step "ip -n $host_a route show table 100 (empty)"
ip -n "$host_a" route show table 100

step "naplesctl get routes (none)"
"$bin/naplesctl" get routes

echo
echo "Part 3: traces from web-a to web-b"

step "naplesctl apply -f examples/overlay.yaml --wait; naplesctl apply -f examples/firewall.yaml --wait"
apply_wait "$here/overlay.yaml"
apply_wait "$here/firewall.yaml"

step "naplesctl trace --from web-a --to web-b --proto tcp --port 8080: allowed, delivered"
"$bin/naplesctl" trace --from web-a --to web-b --proto tcp --port 8080

step "naplesctl trace --from web-a --to web-b --proto tcp --port 9090: denied by web-b's ingress policy (exit status 1)"
if "$bin/naplesctl" trace --from web-a --to web-b --proto tcp --port 9090; then
	echo "demo: the trace to 9090 should be dropped" >&2
	exit 1
fi
