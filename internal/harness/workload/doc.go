// Package workload runs the lock-set workload of the end-to-end proofs and
// the demo, after Jepsen's lock-set test: workers repeatedly acquire a
// resource's lock with a short lease, read a counter, pause (sometimes past
// the lease), write the counter plus one and release. A checker compares the
// acknowledged increments with the final counters and checks that the tokens
// of admitted writes never go down.
//
// Three modes tell fencing apart from its absence: [Plain] (lock, plain read,
// plain write), [UnfencedReads] (plain read, fenced write) and [Fenced]
// (fenced read, fenced write). Only Fenced is safe; the other two are the
// negative controls that must show lost updates.
package workload
