// Package testetcd runs clusters of real etcd server processes for tests and benchmarks.
//
// # The binary
//
// Binary builds the etcd server pinned by the tools/etcd module of this repository
// (go.etcd.io/etcd/server/v3 at the version its go.mod requires) once per user and
// architecture, into os.UserCacheDir()/naples/etcd-VERSION-GOARCH (or, for a user without
// a cache directory, into one in os.TempDir() named after the user ID). A file lock next
// to it makes test binaries that run in parallel build it once; the build writes a
// temporary file and renames it, so a binary in the cache is always whole. The first
// build takes about half a minute and downloads modules through the Go proxy; later calls
// only look the file up. Setting $NAPLES_TEST_ETCD to the path of an etcd binary skips
// the build.
//
// # Clusters
//
// Start starts a cluster of members, each an etcd process with its own data directory
// under the test's temporary directory, and returns once the cluster has a leader, has
// committed a write and every member answers a linearizable read. Plan lays a cluster out
// without starting it, so that a test can hand its endpoints to a client first and start
// etcd later with StartAll. Kill sends SIGKILL to a member and Restart starts it again on
// the same data directory and sockets. Every process is killed when the test ends, also
// when the test fails or (on Linux) the test binary dies, and a failed test's log shows
// the tail of each member's output. NewProxy puts a proxy between clients and one member,
// which can hold back what the member sends (Pause, Resume) or cut the clients off (Cut)
// while the cluster runs on.
//
// Members listen on Unix sockets, not TCP ports, for clients and for peers: paths in the
// test's own directory cannot clash with another test or process, so no port is ever
// taken, raced for or retried. Client endpoints are unix:///absolute/path URLs, which the
// etcd client (go.etcd.io/etcd/client/v3) dials as they are. Peers reach each other
// through sockets named relative to the cluster directory, the working directory of every
// member, because etcd's peer transport takes only the host part of a unix URL.
//
// # Settings
//
// Members run with settings for a small shared machine: 50 ms heartbeats and a 500 ms
// election timeout, so that losing the leader costs well under two seconds, and logging
// at level warn. Without Durable they also run with --unsafe-no-fsync: the data still goes
// to the kernel's page cache before etcd answers, so SIGKILL of a member loses nothing,
// while a shared disk's fsync latency no longer stalls raft into spurious elections.
// Benchmarks that measure write latency should pass Durable. MaxTxnOps (default 1024)
// and MaxRequestBytes (default 8 MiB) raise etcd's limits for large transactions, and
// Flags passes any other etcd flag.
//
// The methods of a Cluster fail the test through the testing.TB it was created with, so
// most must be called from the test's goroutine.
package testetcd
