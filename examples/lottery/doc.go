// Command lottery is a batch job that must run exactly once: several
// instances race to draw a day's winners from a users table in PostgreSQL
// (through pgx, or database/sql with -store pgsql; or, with -store mysql,
// MySQL or MariaDB), and the day is drawn once even
// when the instance that won the lock pauses past its lease and another
// takes over.
//
// Each instance takes the lock "lottery:<day>" with a short lease (the
// Redis lock, or with -lock postgres the PostgreSQL lock of lock/pglock,
// in the same database: no Redis at all; or with -store mysql -lock mysql
// the MySQL lock of lock/mysqllock, MariaDB or MySQL alone),
// looks up the day's completion record (LookupOnce) and, if there is none,
// draws through Once: the guard, a completion record for the key
// "lottery-draw:<day>", the choice of winners and their rows commit in one
// transaction. An instance that paused past its lease is refused as stale
// by the guard, since the newer holder's Once raised the mark; an instance
// that finds the day drawn, before Once or through it (ran = false), says
// by which token.
//
// -pause forces the first instance to win the lock to pause after finding
// the day not drawn; -unfenced runs the same job with the lock alone, no
// fence and no completion record, which lets the paused instance draw a
// second time into the same day. It exits with status 2 when a server
// cannot be reached and 1 when the run fails.
package main
