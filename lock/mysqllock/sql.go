package mysqllock

import (
	"encoding/hex"
	"strconv"
	"strings"
)

// The statements of the lock. Each is one CALL of a procedure that
// migration 00005_fencekit_lock creates, one round trip, in the text
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
	// KILLs, and the server's flavour.
	connIDSQL = "SELECT CONNECTION_ID(), VERSION()"

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
