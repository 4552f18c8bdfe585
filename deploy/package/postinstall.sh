#!/bin/sh
# Runs after the naples package is installed or upgraded (.deb: "configure"; .rpm: 1 or 2).
# It makes the system user and group nimbus runs as, from /usr/lib/sysusers.d/naples.conf,
# and has systemd read the units again. It enables and starts nothing: that is the
# operator's choice, after setting the flags in /etc/default. An upgrade does not restart
# a running nimbus or agent either (deploy/README.md, "Upgrades", says in which order to).
set -e
case "$1" in
configure | 1 | 2 | "") ;;
*) exit 0 ;;
esac
if command -v systemd-sysusers >/dev/null 2>&1; then
	systemd-sysusers naples.conf
elif ! getent passwd naples >/dev/null; then
	useradd --system --user-group --home-dir /var/lib/naples/nimbus --shell /usr/sbin/nologin naples
fi
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload || true
fi
