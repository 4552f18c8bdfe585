// Package linux is the HAL's Linux backend: reconcilers that program the kernel through
// netlink, each bound to one network namespace.
//
// Everything the backend creates is marked so that it can be found again: routes carry the
// route protocol RouteProtocol ("naples" in /etc/iproute2/rt_protos terms), and a route is
// identified by its table, destination and metric, all derived from the object. A restarted
// agent therefore adopts what a previous one created instead of creating twins, and kernel
// state that naples did not create is never modified or removed.
package linux
