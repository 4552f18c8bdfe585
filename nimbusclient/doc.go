// Package nimbusclient is the agent's side of the bus: it watches nimbus for the objects
// targeted at this node and writes them into delphi, and streams the status the HAL
// records in delphi back up to nimbus.
//
// The client is the only writer of delphi's desired table; it claims that table's writer
// handle when it is built. A watch that cannot resume starts with a snapshot: the events
// before SYNCED. The snapshot is committed to delphi as one transaction that also removes
// every local object the snapshot did not contain, so objects deleted while the agent was
// away do not linger. A watch that resumes starts with RESUMED instead, and only changes
// follow.
//
// Watch events come in frames of many. The client commits them in groups: a goroutine
// receives frames while the last commit is being written, and everything received by the
// time it is done, up to 10,000 changes or 8 MiB of frames, goes into the next delphi
// transaction, each key's last change only, with the resume point (epoch and revision) of
// the group's last event. A transaction thus holds a prefix of the stream and records
// which, so however the agent stops (a SIGKILL included), delphi holds nimbus's state as of
// its resume point, and the next watch resumes right after it, whether that is the end of
// a frame or the middle of one. The frames of a commit are received into storage that a
// small pool lends (nimbusv1.PooledFrame) and given back once delphi has committed them,
// so a stream of frames leaves next to no garbage behind.
//
// When a stream breaks the client reconnects with exponential backoff and jitter, and
// sends every status again on each new status stream. The backoff starts over once nimbus
// has taken a new stream (a watch's first event, a status stream's headers), so one
// failover after another is not slowed. An idle status stream is watched too: a goroutine
// receives on it, which returns as soon as the connection breaks or nimbus ends the
// stream, and the client reconnects then, not at the next status change. The statuses
// that change together go up back to back, which gRPC writes together.
//
// Options.Address may list several nimbus replicas, or name a host that resolves to
// several addresses. The client connects to each and checks its health (the standard
// health service); its calls go to one replica that says SERVING, picked at random so
// that agents spread over the replicas, and both its streams run on it. A replica that is
// up but not ready (one on etcd that has not read it yet) is skipped. When the replica
// fails or stops serving the client moves to another, and its watch resumes there from
// delphi's resume point:
// replicas that share a store (nimbus on etcd) share its epoch and revisions, so only the
// changes missed come; a replica with another store sends a snapshot and the sweep. Each
// watch logs the address it is up to ("resumed watch" or "synced with nimbus", with
// server=). A replica that holds more than its share of the agents may ask the client to
// move: it ends the watch stream with codes.Unavailable and the trailer
// nimbusv1.MoveTrailer, which names the replica it suggests. The client then ends its
// status stream too, and starts both on another replica than the one that asked (the one
// suggested when it is in Options.Address and ready), where the watch resumes.
//
// # Metrics
//
// The client registers with Options.Registerer, and Close unregisters:
// naples_nimbusclient_watch_connected (1 while a watch stream is up, from its first event),
// naples_nimbusclient_watch_server{address} (1 for the nimbus address that stream is up
// to, as "unix:///path" or "tcp://ip:port"),
// naples_nimbusclient_reconnects_total{stream="watch"|"status"} (streams started again after
// one ended), naples_nimbusclient_watch_starts_total{mode="resume"|"snapshot"},
// naples_nimbusclient_events_received_total (watch events, snapshots and markers included),
// naples_nimbusclient_status_reports_total (statuses sent) and
// naples_nimbusclient_moves_total (times a replica asked the client to move).
package nimbusclient
