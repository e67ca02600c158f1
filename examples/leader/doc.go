// Command leader runs candidate processes that elect a leader with package
// election; the leader writes a heartbeat row to PostgreSQL every -beat,
// each in a transaction fenced by its term (storage/postgres InTx).
//
// The parent starts -members processes (itself, with -member), follows the
// election with Observe, and stops the leader with SIGSTOP for -pause: its
// lease runs out, another member is elected and writes. The stopped member,
// resumed with SIGCONT, finishes the heartbeat it was writing when it
// stopped, with its old term's fence: the guard refuses it as stale, and the
// heartbeats' tokens never go back. With -unfenced the members write
// without the fence and the same late heartbeat overwrites the new
// leader's row, which the summary reports.
//
// -failover N kills the leader with SIGKILL N times instead, and reports
// the time from each kill to the new leader's first heartbeat (p50, p99);
// -v prints the members' own lines as well.
// It exits with status 2 when a server cannot be reached and 1 when the
// run fails.
package main
