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
// Files:
//   - history.go: the recorder of calls and the porcupine run, which writes
//     a rejected history as porcupine's HTML view and as text;
//   - budget.go: how long a checker runs and with which seed
//     (FENCEKIT_CHECK_TIME, FENCEKIT_CHECK_SEED);
//   - redismodel.go, pgmodel.go: the sequential models, one versioned,
//     fenced register per key or row, in which a refused call changes
//     nothing;
//   - redis_test.go, postgres_test.go: the checkers, with their workloads;
//     nemesis_test.go: the faults; keys_test.go: the keys in use;
//   - controls_*_test.go: the negative controls, broken variants that the
//     checker must reject in most runs, each run lasting until its variant
//     has gone wrong a few times (runContext in budget.go);
//   - model_test.go: the models on histories small enough to judge by hand.
//
// The seed replays a run's random choices, not its timing: on a real
// network and servers two runs with one seed differ.
//
// Settings, all from the environment:
//   - FENCEKIT_CHECK_TIME: how long each checker generates calls (default
//     4s, 2s under -short); the negative controls share it among their runs;
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
