// Package linux is the HAL's Linux backend: reconcilers that program the kernel through
// netlink, each bound to one network namespace.
//
// Everything the backend creates is marked so that it can be found again: routes carry the
// route protocol RouteProtocol ("naples" in /etc/iproute2/rt_protos terms), and a route is
// identified by its table, destination and metric, typed values derived from the parsed
// object (an IPv6 route with metric 0 is the kernel's metric 1024). A restarted agent
// therefore adopts what a previous one created instead of creating twins, and kernel state
// that naples did not create is never modified or removed, in either family. The store the
// reconcilers read must declare the indexes Indexes returns, by which they find the object
// that owns a kernel route.
//
// Every netlink request is bounded by RouteOptions.Timeout and checks its context first,
// so a stuck kernel fails a reconcile, which is retried, instead of pinning a worker or
// blocking shutdown.
package linux
