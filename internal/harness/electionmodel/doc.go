// Package electionmodel is the election model's workload and judge,
// written once for every lock backend: a backend's test supplies its
// candidates (each an election on a Locker of its own, whose connection can
// be cut), its faults, and after the run its own history of lock and
// record writes, and the model judges them all the same way.
//
// The workload ([Run]): candidates campaign; while a candidate leads it acts
// (a write, a scheduled job) for a random while, checking before each act
// that it still leads, then resigns. A nemesis cuts the current leader off
// for one and a half to three and a half TTLs, so that terms are lost, not
// only handed over; now and then a candidate's record write is held past
// the TTL after its grant, where the backend can hold one, so that another
// candidate takes the lock as the write arrives; a planter writes a record
// with a token above every term's where the backend lets one be planted,
// or a twin: a record of another holder naming the token the lock grants
// next, its counter raised to match, as a second grant of one token would
// leave, or an older record, one token below the live one and of its
// holder, which an observer's read finds; a backend's own faults (a terminated session, a stopped member) run
// beside them. An observer records what Observe reports.
//
// The judge ([Judge]) decides, from the client's history:
//
//   - one believer: no act of a term happens after a later term began. An
//     act is timed from before its leadership check, a term's beginning
//     from after Campaign returned, so scheduling delays only make a pair
//     inconclusive, never a violation;
//   - tokens: a term whose acts all came before another's acts has the
//     lower token;
//   - observers: every term that acted was reported, with its value, and
//     the reported tokens strictly increase;
//
// and from the backend's own history of writes ([ServerLog]):
//
//   - record holder: every record written names the grant that holds the
//     lock at that instant (no phantom leader);
//   - record token: a live record is never replaced by one with a lower
//     token, or with the same token and another holder (a twin's token's
//     own grant must advance past it, never write over it);
//   - step-down: a term whose lock ran out (rather than being released)
//     ended at least a floor before the lock was next granted.
//
// Each judgment is counted by kind; [Check] fails a run that judged fewer
// than its floors, and logs one summary line per run ([Summary]: "<backend>
// election model judged (<run>): <kind> <count>, ..."), also appended to
// the file FENCEKIT_JUDGED_LOG names ([Log]), which CI prints. [Rejects]
// runs a broken variant (a control) over several seeds and requires the
// judge to reject it in most of them.
//
// Files: workload.go holds the workload (Run, Config, the history),
// judge.go the judge and the server-side events a backend supplies,
// check.go the floors, the controls' runs and the summary line,
// controls.go the broken variants of the election on Redis
// ([RedisControls]), shared by every Redis client's model.
package electionmodel
