// Command lottery is a batch job that must run exactly once: several
// instances race to draw a day's winners from a users table in PostgreSQL
// (or, with -store mysql, MySQL or MariaDB), and exactly one draw is
// recorded even when the instance that won the lock pauses past its lease
// in the middle of the draw and another takes over.
//
// Each instance takes the Redis lock "lottery:<day>" with a short lease,
// checks in a fenced read whether the day is drawn, chooses winners if not,
// and records the draw and its winners in one fenced write (the guard, an
// insert on the unique draw key and the winner rows, as one batch). An
// instance that paused past its lease is refused as stale at its write:
// a newer holder's fenced read raised the guard's mark in the meantime.
//
// On MySQL there is no pipelined batch: the fenced write is one transaction
// whose first statement is the guard (storage/mysql's InTx), and a stale
// fence sends nothing after it.
//
// -pause forces the first instance to win the lock to pause after choosing
// its winners; -unfenced runs the same job with the lock alone, which lets
// the paused instance add its winners to the day's draw. It exits with
// status 2 when a server cannot be reached and 1 when the run fails.
package main
