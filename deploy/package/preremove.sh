#!/bin/sh
# Runs before the naples package is removed (.deb: "remove"; .rpm: 0), not before an
# upgrade: it stops nimbus and the agent, whose binaries are about to go. The agent
# leaves what it programmed in the kernel (deploy/README.md, "Decommissioning a host").
set -e
case "$1" in
remove | 0) ;;
*) exit 0 ;;
esac
if [ -d /run/systemd/system ]; then
	systemctl disable --now nimbus.service naples-agent.service >/dev/null 2>&1 || true
fi
