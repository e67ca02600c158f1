// Package election elects one leader among candidates through a fencekit
// lock, and hands the leader a fencing token that storage checks: a leader
// steps down before another can be elected, and a deposed leader that acts
// anyway (it paused, or its step-down came too late) has its writes refused
// by every fencekit store once the new leader has written there.
//
// A term is a lease of the [lock.Locker]'s lock on the election's name,
// renewed automatically while the leader lives and reaches the lock's
// server; its [fence.Fence] carries a token above every earlier term's. It
// works alike on every backend of package lock (one Redis server, a Redis
// Cluster, whose election keys share one hash slot, Redlock's nodes,
// PostgreSQL through lock/pglock, etcd through lock/etcdlock): the term,
// the record and the step-down are written once above them. What differs
// is the lock's (what a failover does to leases, how waiters are woken),
// said in each backend's constructor; [Term.Proclaim] needs a backend that
// rewrites the record in place (Redis and Redlock) and is refused on the
// others.
//
// # Ways to use it
//
//   - [Run] is the loop most services want (as client-go's leaderelection
//     runs): campaign, run a func(ctx context.Context, f fence.Fence) error
//     while leading, with a ctx that ends when the term is lost, resign when
//     it returns, campaign again, until ctx ends. A server that cannot be
//     reached is retried, not returned.
//   - [Election.Campaign] waits (through the lock's wait queue, in arrival
//     order on every backend with one; see [lock.Locker.Acquire]) until
//     this candidate leads and returns its [Term]: [Term.Fence]
//     for storage, [Term.Done] and [Term.Err] for its end, [Term.Resign] to
//     hand over at once, as etcd's concurrency.Election does.
//   - [Election.Leader] says who leads now (the value the leader campaigned
//     with or last proclaimed with [Term.Proclaim], and its token), and
//     [Election.Observe] reports each new leader in order, with increasing
//     tokens.
//
// Coming from client-go's leaderelection or etcd's concurrency.Election,
// docs/recipes.md ("Coming from client-go or etcd") maps their callbacks,
// durations and methods to these.
//
// # Why the leader steps down first
//
// No lease-based elector can promise alone that two leaders never act at
// once: a leader that pauses (a GC pause, a stopped VM, SIGSTOP) acts when it
// wakes, whatever it checked before the pause, and client-go's and etcd's
// electors have split-brain reports for that reason. What an elector can
// promise is the order of beliefs: the old leader stops believing it leads
// before anyone else can start. Here a term ends ([Term.Done] closes, Run's
// ctx is cancelled) as soon as its lease can no longer be known held: a
// renewal was refused, or renewals kept failing until the lease's validity
// ([lock.Lease.Validity]: the TTL less the time since the last successful
// renewal was sent, on the local clock) came within the step-down margin
// ([WithStepDown]; a quarter of the TTL by default, and never less than the
// clock-drift allowance [Drift], TTL/100 + 2ms, Redlock's allowance). The
// server lets the lock go no earlier than a TTL after it received that renewal,
// which is after it was sent, and only then can another candidate be
// granted the lock; so the old term has ended at least the margin first.
// The margin is client-go's lease duration less its renew deadline (15s
// and 10s there: a third); measured with a 400ms TTL and a leader cut off
// from Redis over 40 rounds, the old term ended min 91ms, p50 101ms before
// the next leader was elected (the drift allowance alone left min 0ms, p50
// 7ms: any delay of the old leader's timer past that gave two believers).
//
// The assumption is about clocks: the leader's clock must not run slower
// than the lock server's by more than the margin over one TTL, and the
// leader's process must get to run (its timer must fire) within that
// margin. A leader paused past its term breaks the second half; a clock
// that runs slow breaks the first. That is what the fence is
// for: whatever the clocks do, storage admits a fence only if it is not
// older than the newest it has seen (see package fence), so once the new
// leader has written, the old term's writes are refused as stale, and a
// write made under a term is safe to make whether or not the term still
// holds. [Term.Leading] checks the clock at the moment of the call, which
// is a better check before acting than a look at Done after a pause, and
// still no substitute for the fence.
//
// # Hand-over, crashes and lost data
//
// [Term.Resign] closes Done, then releases the lock, and the release grants
// it to the candidate that has waited longest in the same script, so the
// next leader is elected within a round trip or two, not a lease later. A
// leader that crashed is replaced when its lease runs out: within the TTL,
// plus the queue's bound (the head of the queue retries when the lease it
// saw runs out, and every second in any case). The term's lease is the
// failure-detection window: client-go's default is 15s, etcd's session TTL
// 60s; pick the shortest your server's latency allows (renewals go every
// third of it).
//
// When the backend loses the lock (on Redis a restart without persistence,
// a failover to a replica that had not seen it, FLUSHALL; on PostgreSQL a
// crash or a failover, which empty its UNLOGGED lease table), a candidate
// can be elected before the old leader's next renewal finds its lease gone,
// so for that moment two candidates believe they lead. Tokens still
// increase (anchored to the server's clock; on etcd they are revisions,
// which never go back; see package lock), so the new term's fence wins in
// storage and the old one's is refused, and observers go on seeing terms
// in order.
//
// # What is stored
//
// The leader record is kept by the Locker's backend, beside the lock, and
// only the lock's holder can write it; the election uses nothing else of
// the backend. On Redis, besides the lock's keys, an election keeps its
// leader record
// ([RedisNames.RecordKey], a hash with the leader's value, token and holder
// id, and a count of the values proclaimed, in the lock's hash slot), written when a term is won by a script that
// admits only a token above the recorded one, so a deposed leader can never
// write over a newer leader's record; it lives as long as the lock, plus the
// TTL. Each new leader is announced on [RedisNames.Channel] (sharded pub/sub
// on a cluster), and so is each value proclaimed. The holder id stays in Redis: it is what releases the lock,
// and no call of this package returns it except the leader's own fence.
//
// # Operations
//
// An Election reports through OpenTelemetry's global providers unless
// [WithMeterProvider] or [WithTracerProvider] say otherwise:
// fencekit.election.leading (whether this process leads),
// fencekit.election.terms (terms won, resigned and lost) and a span per
// campaign. Alert on terms lost: each is a leader cut off or paused for a
// TTL.
package election

// Where things are, for those who work on this package (not part of its
// documentation):
//
//   - election.go: New, options, the keys, argument checks;
//   - campaign.go: Campaign, the leader record's write, Term (its watcher,
//     which ends it by the validity rule, and its record keeper);
//   - leader.go: Leader and Observe;
//   - proclaim.go: Proclaim (proclaim.lua);
//   - run.go: Run;
//   - telemetry.go, errors.go.
//
// The record itself is the lock backend's (internal/lockbackend's
// Recorder): on Redis, package lock's record.go and record_put.lua,
// record_keep.lua and record_read.lua; on Redlock, redlock_record.go.
