// Package rtnl talks rtnetlink (NETLINK_ROUTE) to the kernel, for the HAL's Linux
// backend: sockets bound to a network namespace (OpenSocket), subscriptions to its
// notifications read many datagrams to a recvmmsg (Subscription, `ip monitor`), a
// reader of dumps and single objects (Reader, `ip link show`), a batched writer that
// sends many requests in one sendmsg and hands each caller the kernel's answer to its
// own (Batcher), the kernel's objects as typed messages with one decoder and one
// request builder each (Link, Addr, Route, Rule, Neigh: ParseLink and AppendLinkRequest,
// ...), and the builders and decoders of messages and attributes beneath them (Message,
// AppendAttr, EachAttr, the dump requests).
//
// It holds no reconcile logic and keeps no state of the kernel's: what a request means,
// and what becomes of an answer, is its caller's.
package rtnl
