// Package rtnl talks rtnetlink (NETLINK_ROUTE) to the kernel, for the HAL's Linux
// backend: sockets bound to a network namespace (OpenSocket), subscriptions to its
// notifications read many datagrams to a recvmmsg (Subscription, `ip monitor`), a
// reader of dumps and single objects (Reader, `ip link show`), a batched writer that
// sends many requests in one sendmsg and hands each caller the kernel's answer to its
// own (Batcher), and the builders and decoders of messages and attributes (Message,
// AppendAttr, EachAttr, the dump requests).
//
// It holds no reconcile logic and keeps no state of the kernel's: what a request means,
// and what becomes of an answer, is its caller's.
package rtnl
