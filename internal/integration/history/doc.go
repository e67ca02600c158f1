// Package history checks fencekit's stores for linearizability: concurrent
// clients run random operations against a real server through fault
// proxies, every call's invocation and return are recorded, and porcupine
// (github.com/anishathalye/porcupine) searches for an order of the calls
// that a sequential model of the store explains. A call whose outcome the
// client cannot know (a network error, a context that ended, an error
// matching fence.ErrOutcomeUnknown) stays open to the end of the history,
// as Jepsen records it: the checker may place its effect anywhere after its
// invocation, or nowhere.
//
// A checker must be able to fail, so each one counts what it judged by kind
// (calls of each operation that returned a definite answer, refusals,
// conflicts, open calls placed, Once calls whose unknown outcome a retry
// told, Once calls the server refused, which the model allows only where
// the work would have run, attacks answered) and fails a run that judged fewer of a kind than
// its floor, a rate per second of the budget (Judgments, Rates). The
// workloads attack as well as replay honest clients: fences no lock issued
// (a live grant's token with another holder, its holder with an older
// token, another grant's holder), an older grant racing the next one's
// first call, compare-and-sets at versions a key has not reached or has
// passed or at the version of a value that has since expired, and Once calls whose COMMIT reply is lost or whose context ends
// while COMMIT is in flight.
//
// Files:
//   - history.go: the recorder of calls, the porcupine run, which writes
//     a rejected history as porcupine's HTML view and as text, and the
//     judgment counts with their floors (Tally, Judgments.Require), for
//     every checker;
//   - budget.go: how long a checker runs and with which seed
//     (FENCEKIT_CHECK_TIME, FENCEKIT_CHECK_SEED);
//   - redismodel.go, pgmodel.go: the sequential models, one versioned,
//     fenced register per key or row, in which a refused call changes
//     nothing; the Redis model's values may carry a lifetime, and their
//     expiry, which counts as a delete, falls anywhere in the window that
//     the writing call's invocation and return give it (StampRedis); pgmodel.go's is every SQL guard's (PostgreSQL, MySQL), with
//     Once, and PgKinds counts its judgments;
//   - redis_test.go, postgres_test.go, mysql_test.go: the checkers, with
//     their workloads; nemesis_test.go: the faults; keys_test.go: the keys
//     in use;
//   - controls_*_test.go: the negative controls, broken variants that the
//     checker must reject in most runs, each run lasting until its variant
//     has gone wrong a few times (runContext in budget.go); the variants are
//     built in test code: scripts_test.go runs a Redis store script with one
//     line changed, pgbreak_test.go and mybreak_test.go change the guards'
//     statements on their way to the server and hold the broken guards and
//     Once;
//   - model_test.go: the models on histories small enough to judge by hand.
//
// The seed replays a run's random choices, not its timing: on a real
// network and servers two runs with one seed differ.
//
// Settings, all from the environment:
//   - FENCEKIT_CHECK_TIME: how long each checker generates calls (default
//     4s, 2s under -short); the negative controls share it among their runs
//     unless FENCEKIT_CONTROL_TIME sets theirs;
//   - FENCEKIT_CONTROL_TIME, FENCEKIT_CONTROL_RUNS: the budget each negative
//     control's runs share, and how many seeds it runs (default 3);
//   - FENCEKIT_CHECK_SEED: the seed to replay;
//   - FENCEKIT_HISTORY_DIR: where rejected histories are written;
//   - FENCEKIT_CHECK_LENIENT_GET=1: leave open every fenced Get of the Redis
//     store that may have been retried, to look past the known defect of
//     retried Gets for other violations;
//   - FENCEKIT_CHECK_STRICT_UNKNOWN=1: fail a run in which a call that may
//     have written ended in an error that does not match
//     fence.ErrOutcomeUnknown;
//   - FENCEKIT_CHECK_LEAVE_OPEN=1: leave such a call open, as if its
//     outcome were unknown. By default it is closed as not applied, so
//     that the checker also judges the store's claim that the call was not
//     applied (never reached Redis; rolled back by PostgreSQL).
package history
