#!/bin/sh
# Runs after the naples package is removed or purged: systemd forgets the units. The
# user naples and the state in /var/lib/naples stay, as other packages leave theirs.
set -e
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload || true
fi
