// Package nimbus is the desired-state bus server: the authoritative store of the objects
// controllers publish, the per-node watch fan-out that carries them to the naples agents,
// and the intake of the status the agents report back.
//
// # Store
//
// Objects and node statuses live in memory, in tables that are copy-on-write B-trees
// (github.com/tidwall/btree). One write transaction runs at a time, on a copy of the
// tables that shares every tree node with them and copies each node it changes once; its
// commit publishes the copy, and an aborted one leaves nothing. A read takes the last
// published tables without a lock and sees one committed state, however much is committed
// while it lasts.
//
// Every change to an object (Apply that changes something, Delete of an existing object)
// takes the next value of a single monotonic revision counter, which the stored object
// carries in meta.revision. The counter is scoped by an epoch, a random 128-bit hex string
// made by New: a revision is only meaningful together with the epoch it was issued in.
// Stored objects are immutable: every write stores a fresh clone, so readers never lock
// and what Get, List and Watch hand out is never modified afterwards.
//
// Apply assigns uid, generation, revision and the times; whatever a client puts there is
// ignored. It stores an empty tenant or namespace as "default" and the target nodes sorted
// and without duplicates, so listing the same nodes in another order is no change. The generation starts at 1 and is bumped when the spec or the target nodes
// change; a change of labels only takes a revision but keeps the generation, and applying
// what is already stored changes nothing at all. meta.generation_revision is the revision
// of the change that made the current generation, which a change of labels keeps too.
//
// ApplyBatch and DeleteBatch write many objects in one call, as that many Applies or
// Deletes in a row would, but all or nothing: every entry is validated first, and one
// invalid entry refuses the call with codes.InvalidArgument naming its position and key
// (`objects[3] (Route/default/default/x): spec.prefix "10.0.0.0/33": ...`) before
// anything is stored. A key may appear only once per call; a second appearance is refused
// the same way, naming both positions, because a batch means one final state per object.
// The status carries the same as an errdetails.BadRequest whose field violations name
// each bad entry and field, `objects[3].spec.prefix`, so that a client finds the entries
// without reading the message (nimbusv1.BadEntriesReason says how). Each object that changes still takes its own revision, consecutive in the order of the
// call, and unchanged ones take none. ApplyBatch answers with every stored object unless
// the request sets omit_objects, when each result carries only the generation and revision
// stored. A single Apply or Delete is a batch of one: both go through the same commit path.
// An object larger than Options.Limits.ObjectBytes as sent (1 MiB by default) is refused
// at Apply and ApplyBatch with codes.InvalidArgument naming it, its size and the limit,
// so that every object, with its status, can be read back by clients with gRPC's default
// 4 MiB receive limit. List answers in pages of at most Limits.ListPageBytes (and the
// request's limit), each with the token of the next; nimbusv1.ListAll follows them.
//
// An object that would take a value another object holds (an endpoint's address in its
// tenant, its MAC in its network, a host interface on a node, a VNI, a tenant's address
// space), or that leaves an endpoint's address outside its network's subnets, is refused
// with codes.FailedPrecondition naming both objects, checked at commit against the store
// and the batch's earlier writes; a batch with such an entry stores nothing. See
// conflict.go.
//
// An Apply or ApplyBatch with dry_run is checked as the apply would be, the cross-object
// checks included, and answers what the apply would do, but stores nothing: no revision,
// no watch event, nothing on disk or in etcd. It needs the rights of an apply, and
// naples_nimbus_dry_runs_total counts it. See dryrun.go.
//
// Where the objects are kept is the store's business, behind one small interface the
// Server declares (backend.go): commit a group of batches and hand their changes to the
// watchers, catch up with a revision or with the objects status reports name, say whether
// it is ready, close. The embedded store keeps them in the tables above, durable with
// Options.DataDir (see Persistence); the etcd store keeps them in etcd, the tables being
// its cache (see Replicas on etcd). The Server takes neither mode into account anywhere
// else. Neither store holds the Server: each stages its changes in the tables inside one
// call the Server runs under the lock that orders its changes (publisher), and the Server
// then hands them to the watchers.
//
// # Watch
//
// A node's Watch first receives every object that targets it as PUT events (the
// snapshot), then SYNCED with the snapshot's revision, then one PUT or DELETE per committed
// change that concerns the node, in commit order, each with its own revision, a batch's
// changes too. Registration and the snapshot read happen under the lock every commit holds
// while it hands its changes to the watchers, so no change is missed or sent twice.
//
// The stream carries WatchFrames: each holds as many consecutive events as are ready to
// go, up to 32 KiB of them (an event larger than that travels alone), so a snapshot or a
// burst of changes takes a frame per hundred events or so (of a few hundred bytes each)
// rather than a message per event. Where a frame ends means nothing; a frame may hold the
// end of a snapshot, SYNCED and the first changes.
//
// Every object's event is encoded once per revision and shared: each change is built once
// per commit as an immutable value carrying its revision, its PUT event is also kept with
// the stored object, and a snapshot sends the stored object's event. A frame is those
// encoded events, each copied behind the tag and length of WatchFrame.events, so a change
// or a snapshot sent to a thousand watchers encodes each object once. Snapshot events are therefore the very PUT events of the objects' last
// changes and carry no snapshot mark: a watch that does not start with RESUMED starts with
// a snapshot, and its events before SYNCED are the snapshot.
//
// The last Options.HistoryWindow changes are kept, oldest dropped first. A Watch that
// carries the server's epoch and a revision R whose later changes are all still kept resumes
// instead: it receives RESUMED with R, then every kept change after R that concerns the node
// (a PUT for an object that targets it, a DELETE for a deletion or a retarget away from it),
// then the live changes; the kept changes are queued under the same lock as registration, so
// again nothing is missed or sent twice. R may be any revision, one in the middle of a
// batch's changes or of a frame included: a client that stored part of a frame resumes
// right after what it stored. Any other Watch (no epoch, another epoch, R too old or
// ahead of the current revision) gets the snapshot.
//
// Commits never wait for watchers. Each watcher has a bounded queue; a watcher that has
// Options.WatchBuffer events queued or more when a commit needs it is reset (a commit
// that finds fewer queues all of its events, so one large batch alone resets no watcher
// that keeps up): it is unregistered and its queued events are dropped at once, even when
// its stream is stuck sending to a client that does not read (a stopped process), so it
// holds on to at most the frame under way. Its stream ends with codes.ResourceExhausted as
// soon as the client reads what was already sent, and the client watches again, resuming
// from the last revision it stored while that is in the window. An idle watch receives a
// BOOKMARK with the current revision every Options.BookmarkInterval.
//
// # Persistence
//
// With Options.DataDir the store is durable: DataDir/nimbus.db is a bbolt file holding every
// object, the revision and the epoch, in the layout delphi's state file has too (see
// internal/statefile). A commit writes its objects and the revision there, in one
// state-file commit (a record of the file's log, one fsync; a bbolt transaction when
// large), before its changes become visible to readers and watchers; a commit whose write
// fails stores nothing, in memory or on disk. Every call
// that writes returns only once its changes are durable.
//
// Concurrent writers share commits (group commit). The first caller that finds no commit
// under way leads: it takes every batch queued, its own included, and commits them in one
// store transaction and one state-file commit, each batch after the one before, each
// change with its own revision; then it hands the changes to the watchers in revision
// order under the same lock, answers every caller, and passes the lead to the oldest
// batch queued meanwhile, which commits everything that gathered while the previous commit
// was being written. A lone caller commits at once and never waits for company. A batch is
// validated by its own call before it is queued, so one caller's bad object fails that
// call alone; only a failure of the shared commit itself (the store closed, the disk
// write failing) fails every batch in it, and then none of them is stored. New loads the
// file, so objects, revisions and the epoch carry on across restarts and agents can resume;
// the history starts empty, so only a watch at the current revision resumes right after a
// restart. A new file is given a fresh epoch. Statuses and which nodes watch are memory
// only: the agents report them again.
//
// The file records the version of its layout. Files written before it did have none and
// are read as version 1, the layout they have; New then records it. A file New cannot read
// back (bbolt rejects it, an object does not parse, is stored under another key or has a
// revision beyond the store's, the epoch is missing, or the version is not 1) fails New
// with ErrCorrupt, and a file another process holds, after a 5s wait, with ErrLocked; both
// errors name the file.
//
// # Replicas on etcd
//
// With Options.Etcd the objects live in etcd instead, and the Server is one of any number
// of stateless replicas sharing them; everything above holds for each replica, except that
// a change's revision is etcd's revision shifted left by 16 bits plus the change's position
// in its etcd transaction, so revisions are increasing but not consecutive, and a batch is
// atomic up to etcd's transaction limit. Revisions mean the same on every replica, so a
// watch resumes on any of them. See etcd.go. With Options.ReplicaName the replicas push the
// statuses and watermarks their agents report, and which nodes watch them, to each other,
// so every replica answers Get, List and WatchStatus alike; see peer.go. With
// Options.Rebalance a replica that holds more than its share of the agents asks some to
// watch another replica, where they resume; see rebalance.go. docs/replicas.md describes
// all of it for users.
//
// # Metrics
//
// The server registers with Options.Registerer: naples_nimbus_watcher_resets_total,
// naples_nimbus_watch_starts_total{mode="resume"|"snapshot"}, and the gauges
// naples_nimbus_watchers (streams receiving changes), naples_nimbus_revision and
// naples_nimbus_objects and naples_nimbus_statuses (node statuses held) and
// naples_nimbus_status_watermarks (nodes with a status watermark), the counter
// naples_nimbus_commits_total (commits that changed objects, each one state-file commit
// with a data directory) and the histogram naples_nimbus_commit_batch_size (object changes
// per commit). The limits add the counters naples_nimbus_status_truncated_total{field},
// naples_nimbus_status_details_omitted_total, naples_nimbus_objects_too_large_total and
// naples_nimbus_list_pages_cut_total (limits.go), the counter
// naples_nimbus_node_status_pages_cut_total (nodestatuses.go), the gauge
// naples_nimbus_streams{role,method} and the counter
// naples_nimbus_streams_refused_total{role,method,reason} and the gauge
// naples_nimbus_stream_refusals_held (streams.go), the gauge
// naples_nimbus_stream_identities and the counters naples_nimbus_status_throttled_total
// and naples_nimbus_status_throttled_seconds_total (rates.go), the counter
// naples_nimbus_status_watermark_moves_delayed_total (watermarkrate.go), and the counter
// naples_nimbus_tls_handshakes_refused_total{reason} (handshake.go); docs/limits.md lists
// them with their limits. A replica adds
// naples_nimbus_peers and naples_nimbus_peer_reports_total{direction} (peer.go),
// naples_nimbus_rebalanced_total (rebalance.go), and with
// etcd naples_nimbus_etcd_loaded, naples_nimbus_etcd_txns_total,
// naples_nimbus_etcd_txn_conflicts_total, naples_nimbus_etcd_txns_over_limit_total,
// naples_nimbus_etcd_watch_restarts_total, naples_nimbus_etcd_cut_off,
// naples_nimbus_etcd_cache_age_seconds and naples_nimbus_etcd_compacted_revision
// (etcd.go). Close unregisters them.
//
// # Status
//
// Agents stream NodeStatus reports with ReportStatus. A report is kept for the pair (object,
// node) while the object exists and is meant for the node (its meta.nodes lists the node or
// is empty), and until the Node object of that name is deleted. Get and List aggregate them
// into an ObjectStatus for the object's current generation: the target nodes programmed,
// failed and reporting it at all, the target nodes still pending (not PROGRAMMED or FAILED
// at it, including those that reported nothing), and, once every target node is PROGRAMMED,
// the time the last of them got there. An object with no target node is never caught up.
//
// A server says in ReportStatus's headers that it takes status watermarks
// (nimbusv1.StatusWatermarkHeader), a replica too, and agents then report a watermark and only
// the statuses it does not say: their exceptions and statuses with operational data. A
// node's watermark is kept, like its reports, until its Node object is deleted; a stream
// open then that sends the node's watermark again is ended with codes.Aborted, so that
// the agent reports its exceptions again on a new one. One of another epoch than the
// server's counts as none. A node's status of an object is then
// the report it keeps, whatever its generation (one without a phase counts as nothing
// reported); else PROGRAMMED at the object's generation when the watermark is at or past
// the object's generation revision (meta.generation_revision), since the watermark got
// there as far as the server keeps its last moves; else nothing reported. A report that
// says no more than the watermark (PROGRAMMED at the current generation, no operational
// data, the watermark past it) is not kept, and a stream's first watermark drops the
// node's reports the stream did not send before it. Replicas push watermarks to each
// other with the reports, and apply the same rules to what they receive (peer.go).
// docs/status.md describes it for users.
//
// The target nodes are meta.nodes, or for an object for every node (empty meta.nodes) the
// nodes that have a Node object together with the nodes that have a Watch stream open now.
// Only a node's own watch makes it a target: with TLS, the watch of a node certificate. A
// publisher watching a node, to see what the node receives, makes it no target and has no
// bearing on its staleness; without TLS no caller has an identity, and every watch counts
// as the node's own.
// A node that watched once and went away without a Node object is no target, nor is a node
// that only reported; deleting a node's Node object ends its membership unless it is
// watching. Only target nodes count, in every field of the ObjectStatus: a report kept for a
// node that is no target at the moment (an object for every node keeps reports from any
// node) is left out, and counts again once the node is a target again, for example when its
// agent watches again.
//
// A node whose agent has had no open Watch stream for Options.StaleAfter, measured with
// Options.Now, has its statuses marked stale: they are still reported and counted, as the
// last word of the node, with stale set. A new watch of the node clears it. The server keeps
// when a node's last stream ended for as long as the node has a Node object or a stored
// status, which is as long as staleness can concern it; once it has neither and no open
// stream, that is forgotten, and a node with nothing on record, such as one that has never
// watched, counts from New.
//
// What a node reports is bounded by Options.Limits: a message or reason longer than its
// limit is cut and ends with "… [truncated N bytes]"; operational entries beyond the
// limits of entries, key bytes and total bytes are dropped, which the entry
// OperationalTruncatedKey then says, and long values are cut as messages are; typed
// operational data larger than the operational bytes keep the first entries of their
// lists that fit, and say how many they left out. A report is cut rather than refused,
// so that a node's phase and generation always count. An object's status as Get, List
// and WatchStatus send it carries the messages and
// operational data of its nodes up to Limits.StatusDetailsBytes, and counts the nodes
// left without them in details_omitted, so that the status of an object of 10,000 nodes
// still fits a client's default 4 MiB. It lists at most Limits.StatusNodes nodes and
// pending nodes, those with something to tell first, and counts the others in
// nodes_omitted and pending_omitted; its counts count every node (docs/status.md).
// Deleting an object deletes every status of it, on every replica.
//
// WatchStatus streams the same ObjectStatus, as Get aggregates it, for the objects a
// publisher selects by kind, tenant, namespace and name (empty fields select all): first
// every selected object as a PUT, then SYNCED, then a PUT when an object's status may have
// changed and a DELETE when a selected object the client has is deleted. Commits, status
// reports and watch streams opening or ending only mark in each status watcher what may
// have changed (an object; a node, whose objects are the ones targeting it; a node's
// watermark moving across revisions, whose objects are the ones targeting the node with
// a generation revision among them); they never wait for it. A watcher flushes as soon as something is marked and it is not busy
// sending: it recomputes each marked object once, in a read of the store taken after the
// marks, and sends only those that differ from
// what it last sent the client, in frames of about 1 MiB at most. What is marked while a
// flush is computed and sent waits for the next one, so a burst of reports costs one
// event per object per flush, and what a watcher holds is bounded by the
// objects and nodes there are, however slowly its client reads. Staleness comes with
// time, not with a change: a watcher looks for nodes whose statuses turned stale every
// StaleAfter/2, at most every second, and sends the objects they concern; it may send a
// stale mark up to that long after Get shows it. The stream ends with codes.Unavailable
// when the Server is closed; watching again starts with the current state again.
//
// Because watch events are sent in their pre-encoded form, a Server must be served with
// Serve, which installs the codec that understands them, and not registered on a
// grpc.Server built elsewhere.
package nimbus
