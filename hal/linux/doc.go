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
// The route reconciler reads the kernel from a hal.Mirror of every route in its namespace
// (`ip route show table all`): one dump fills it, the observer's route subscription keeps
// it current, and the observer's start (also after an overflow) and every sweep dump
// again. A reconcile compares with the mirror and writes only what differs: `ip route
// replace` over a naples route, `ip route add` where the mirror holds none, so that a route
// someone else just added, which the mirror has not heard of yet, fails the write instead
// of being overwritten; deletes name protocol 241, which the kernel matches, so they never
// remove a foreign route either.
//
// Writes go to the kernel through a batcher (nlBatcher), one netlink socket per
// reconciler: a writer goroutine sends every request pending whenever it is free, many in
// one sendmsg, each with its own sequence number and NLM_F_ACK, and each caller gets the
// kernel's answer to its own request, so that concurrent reconciles share system calls
// and a route the kernel refuses fails only its own reconcile. The observer reads route
// notifications many to a recvmmsg and decodes only what the mirror keeps.
//
// Every netlink request is bounded by RouteOptions.Timeout and checks its context first,
// so a stuck kernel fails a reconcile, which is retried, instead of pinning a worker or
// blocking shutdown; a request whose context ends before it is sent is not sent.
package linux
