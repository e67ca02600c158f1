// Package lockmodel is a randomized model of package lock's Locker that
// runs against any lock backend: Redis, PostgreSQL (lock/pglock) and etcd
// (lock/etcdlock) alike.
//
// A backend supplies only what differs ([Backend]): a Locker per actor, on
// connections of its own; a server-side observation of one resource in one
// read (who holds it as the server decides it, that grant's token, the
// waiters queued in order with how long each entry stays live, and a floor
// that every token granted after the read's reply must exceed); optionally
// the log of every grant the server made; the faults it can inject and
// heal; and the broken variants of itself that the model must reject
// ([Control], run by [RunControls]). A backend of independent nodes
// (Redlock) reads each node ([ObserveRedis]) and takes what a quorum says
// ([Nodes]), with a killed node excused from what it granted before. Several actors drive one resource with short leases (TryAcquire,
// Acquire with give-ups, AutoRenew, Extend, TTL, Release, some of them
// late, after the lease ended, leases left to run out, Do with a function
// that panics now and then) while a watcher observes the resource. The
// checks, each counted by kind:
//
//   - promise: a lease whose Validity at local time t0 was v, observed by
//     a read that returned at t1 < t0+v (less a small slack for the clocks'
//     rates), must be held by that lease's holder, with its token, in that
//     read; otherwise the backend let go of a lock its holder was promised.
//     Judged on the local monotonic clock only, so a loaded machine makes a
//     check inconclusive, never wrong. Calls that end a promise (Release,
//     Extend) run under the model's lock, which the watcher holds from
//     reading Validity to the observation's reply. Where the backend reads
//     how long the server holds the lease ([Observation.Left]), every
//     observation also judges that the lease is believed no longer than
//     that, less [Backend.Drift]: a belief past the lease's end is caught
//     while the lease still holds, not only once it has ended.
//   - tokens: a grant that returned before another was asked for has the
//     lower token (no backend under the model offers Owner re-entries).
//     Each such pair is a judgment.
//   - anchor: a grant asked for after an observation's reply has a token
//     above that observation's floor (one judgment per grant, against the
//     highest such floor).
//   - queue: a waiter observed live and queued ahead, when a later asker's
//     grant was made, and still waiting then (its Acquire's deadline not
//     reached, the grant made before its entry could lapse unrefreshed) is
//     served first: the server granted it a lower token. Judged only where
//     the backend keeps a log of its grants, since a waiter can be handed
//     the lock without ever learning it (the hand-over's news came after
//     its lease ran out).
//   - renewal: AutoRenew leases held past their first validity are still
//     held; judged by rate (most must be), since a loaded machine runs some
//     renewals late. Leases whose hold overlapped a fault are not judged.
//   - release: a release that answered that its lease held the lock freed
//     it: the first observation sent after its reply does not find that
//     grant's holder holding (a holder id is granted once).
//
// A run may begin with an uncontended phase ([Config.Uncontended]) in
// which the actors only TryAcquire, so that nobody queues: grants of a
// free lock and of one whose lease just ran out, releases with no waiter,
// late releases that meet the lock another try took. A backend that serves
// that case on a path of its own (PostgreSQL's plain SQL) tells the model
// which grants and releases the server made there ([Backend.Paths]), and
// the run counts those a check judged: [FastGrantsJudged] (by tokens,
// anchor or promise), [FastReleasesJudged] (by release) and
// [LateReleaseMetFast] (late releases that met the lock of a fast-path
// grant, whose holder's promise is observed at once).
//
// The workload counts the states that let the checks decide: a free lock
// with a live waiter queued (leases left to run out while others wait),
// late releases that meet another holder's lock (followed at once by an
// observation that checks that holder's promise), grants with a live
// waiter ahead. A run that judged fewer than its floor of a kind fails.
//
// FENCEKIT_CHECK_SEED replays a run's schedule (each actor draws its steps
// from the seed; goroutine interleavings still differ), FENCEKIT_CHECK_TIME
// sets a run's budget (default 3s).
package lockmodel
