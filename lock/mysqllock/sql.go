package mysqllock

import (
	"encoding/hex"
	"strconv"
	"strings"
)

// The statements of the lock. Each is one CALL of a procedure that
// migrations 00005_fencekit_lock and 00006 create, one round trip, in the text
// protocol with its arguments written as literals (see call): strings as
// hexadecimal literals, which mean the same bytes whatever the session's
// character set and sql_mode (NO_BACKSLASH_ESCAPES, ANSI_QUOTES), numbers
// in decimal. A placeholder would cost a second round trip (a prepare)
// with go-sql-driver/mysql unless the DSN sets interpolateParams, which
// the lock does not ask of its user.
//
// Each procedure is one transaction (START TRANSACTION ... COMMIT, rolled
// back by its handler on any error), which holds whatever the session's
// autocommit; each decides on the resource's row locked FOR UPDATE (or
// read LOCK IN SHARE MODE), so the newest committed state at any
// isolation level. A hand-over's doorbell is rung after the commit.
const (
	grantProc     = "fencekit_lock_grant"
	releaseProc   = "fencekit_lock_release"
	extendProc    = "fencekit_lock_extend"
	ttlProc       = "fencekit_lock_ttl"
	setRecordProc = "fencekit_lock_set_record"
	keepProc      = "fencekit_lock_keep_record"
	proclaimProc  = "fencekit_lock_proclaim"
	recordProc    = "fencekit_lock_record"
	advanceProc   = "fencekit_lock_advance"
	reclaimProc   = "fencekit_lock_reclaim"

	// mariaDBPrefix lifts MariaDB's max_statement_time for one statement:
	// a timeout the session's defaults set must not cut a grant in two
	// (MySQL's max_execution_time applies to SELECT statements only, not to
	// CALL nor to the statements of a procedure).
	mariaDBPrefix = "SET STATEMENT max_statement_time=0 FOR "

	// connIDSQL reads a connection's server-side id, which a cleanup
	// KILLs, the server's flavour and whether the session autocommits.
	connIDSQL = "SELECT CONNECTION_ID(), VERSION(), @@autocommit"

	// killSQL ends a session whose statement's reply was lost, so that it
	// can run nothing more (a request still in the network included).
	killSQL = "KILL CONNECTION "

	// bellSleepSQL is the doorbell's sleep; a hand-over to one of the
	// Locker's waiters interrupts it (KILL QUERY).
	bellSleepSQL = "SELECT SLEEP(1) /* fencekit_lock bell */"
)

// Replies of fencekit_lock_grant, by kind.
const (
	replyRefused = 0 // refused; queued when a place is given
	replyGranted = 1 // granted now, with a new token
	replyHeld    = 2 // already held by this holder: a retry, or a hand-over
	replyTooLate = 3 // the server reached the request past its deadline: nothing changed
)

// notHeld is fencekit_lock_extend's and fencekit_lock_ttl's reply when the
// holder does not hold the lock.
const notHeld = -3

// callSQL is a CALL of proc with args as literals.
func callSQL(proc string, args ...any) string {
	var sb strings.Builder
	sb.WriteString("CALL ")
	sb.WriteString(proc)
	sb.WriteByte('(')
	for i, a := range args {
		if i > 0 {
			sb.WriteString(", ")
		}
		writeLiteral(&sb, a)
	}
	sb.WriteByte(')')
	return sb.String()
}

// writeLiteral writes a as an SQL literal: strings in hexadecimal, whole
// numbers in decimal, bools as TRUE and FALSE, nil as NULL.
func writeLiteral(sb *strings.Builder, a any) {
	switch v := a.(type) {
	case nil:
		sb.WriteString("NULL")
	case string:
		if v == "" {
			sb.WriteString("''")
			return
		}
		sb.WriteString("X'")
		sb.WriteString(hex.EncodeToString([]byte(v)))
		sb.WriteByte('\'')
	case int64:
		sb.WriteString(strconv.FormatInt(v, 10))
	case int:
		sb.WriteString(strconv.Itoa(v))
	case bool:
		if v {
			sb.WriteString("TRUE")
		} else {
			sb.WriteString("FALSE")
		}
	default:
		panic("mysqllock: no literal for a value of this type")
	}
}

// The fast path: an uncontended grant or release is one UPDATE of the
// resource's row, autocommitted, when the row exists, has no queue entries
// (waiting is false) and, for a grant, is free or its lease has ended on
// the server's clock. The grant's token comes back in the reply's
// last-insert-id (LAST_INSERT_ID(expr)), which MySQL 8 and MariaDB both
// send in the OK packet of an UPDATE: one round trip, without RETURNING
// (MariaDB has none on UPDATE, MySQL none at all). An UPDATE that matches
// no row changes nothing and the procedure decides, a second round trip:
// a contended resource, a new one, a retry of a grant whose reply was
// lost. A session whose autocommit is off always takes the procedures,
// which commit themselves.
//
// retain_until_us is assigned before token so that it reads the old token
// whether the session evaluates assignments left to right (the default)
// or all at once (MariaDB's SIMULTANEOUS_ASSIGNMENT).
const (
	fastGrantSQL = `UPDATE fencekit_lock SET
    retain_until_us = GREATEST(%[3]s + %[4]d * 1000, token + 1) + %[5]d * 1000,
    holder = %[2]s, expires_us = %[3]s + %[4]d * 1000, handed_ref = NULL, handed_us = NULL,
    token = LAST_INSERT_ID(GREATEST(token + 1, %[3]s))
WHERE resource = %[1]s AND NOT waiting AND (holder IS NULL OR expires_us <= %[3]s)
  AND GREATEST(token + 1, %[3]s) <= 9007199254740991 AND %[3]s <= %[6]s`

	fastReleaseSQL = `UPDATE fencekit_lock SET
    retain_until_us = GREATEST(%[3]s, token) + %[4]d * 1000,
    holder = NULL, expires_us = NULL, handed_ref = NULL, handed_us = NULL
WHERE resource = %[1]s AND holder = %[2]s AND expires_us > %[3]s AND NOT waiting`

	// nowSQL is the server's clock in µs since the epoch, in UTC whatever
	// the session's time zone, constant within a statement.
	nowSQL = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))"
)

// untilSQL is a grant's deadline in the fast path's UPDATE: µs on the
// server's clock, or one no clock reaches (NULL would match nothing).
func untilSQL(until any) string {
	if us, ok := until.(int64); ok {
		return strconv.FormatInt(us, 10)
	}
	return "9223372036854775807"
}

// literal is a as an SQL literal (see writeLiteral).
func literal(a any) string {
	var sb strings.Builder
	writeLiteral(&sb, a)
	return sb.String()
}
