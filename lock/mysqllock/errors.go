package mysqllock

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lock"
)

var (
	// ErrNotMigrated means the lock's tables or procedures are missing from
	// the connection's database, or are an older migration's: apply
	// migrations 00005_fencekit_lock and 00006_fencekit_lock_grant_until
	// with migrations.UpMySQL first. Nothing was changed. The error's message
	// names the call that found it.
	ErrNotMigrated = errors.New("mysqllock: the lock's schema is missing, run migrations.UpMySQL(ctx, db) once per database (migrations 00005 and 00006)")
)

// Server error numbers the backend reads.
const (
	errNoSuchProcedure = 1305 // ER_SP_DOES_NOT_EXIST
	errWrongArgCount   = 1318 // ER_SP_WRONG_NO_OF_ARGS: an older migration's procedure
	errNoSuchTable     = 1146 // ER_NO_SUCH_TABLE
	errDeadlock        = 1213 // ER_LOCK_DEADLOCK: the transaction was rolled back
	errLockWaitTimeout = 1205 // ER_LOCK_WAIT_TIMEOUT: the statement was rolled back (and the procedure's transaction by its handler)
	errInterrupted     = 1317 // ER_QUERY_INTERRUPTED: KILL QUERY; may have come after the commit
	errStatementTime   = 1969 // MariaDB's max_statement_time; may have come after the commit
	errExecutionTime   = 3024 // MySQL's max_execution_time
	errUnknownThread   = 1094 // ER_NO_SUCH_THREAD: KILL of a session already gone
	errSignal          = 1644 // ER_SIGNAL_EXCEPTION: the procedures' SIGNAL
)

// invalidError is this package's message for an invalid argument; it
// matches [fence.ErrInvalid].
type invalidError struct{ msg string }

func (e *invalidError) Error() string { return "mysqllock: invalid argument: " + e.msg }
func (e *invalidError) Unwrap() error { return fence.ErrInvalid }

func invalid(format string, args ...any) error {
	return &invalidError{msg: fmt.Sprintf(format, args...)}
}

// notMigratedError is ErrNotMigrated for one call, with the server's error.
type notMigratedError struct {
	op  string
	err error
}

func (e *notMigratedError) Error() string {
	return "mysqllock: " + e.op + ": the lock's schema is missing or older (migrations 00005 and 00006: run migrations.UpMySQL(ctx, db) once per database): " + e.err.Error()
}

func (e *notMigratedError) Unwrap() []error { return []error{ErrNotMigrated, e.err} }

// sentError is the error of a statement whose request may have run on the
// server although no answer came back; session is the server's id of the
// connection it went out on (0: unknown).
type sentError struct {
	err     error
	session uint64
}

func (e *sentError) Error() string { return e.err.Error() }
func (e *sentError) Unwrap() error { return e.err }

// serverError returns err's MySQL error, if the server answered with one.
func serverError(err error) (*mysql.MySQLError, bool) {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me, true
	}
	return nil, false
}

// transient reports whether the server refused the statement in a way
// that changed nothing and that a retry may get past: a deadlock or a
// lock wait timeout (the procedures roll back on either).
func transient(err error) bool {
	me, ok := serverError(err)
	return ok && (me.Number == errDeadlock || me.Number == errLockWaitTimeout)
}

// interrupted reports whether the server ended the statement by a kill or
// a timeout: it may have committed before.
func interrupted(err error) bool {
	me, ok := serverError(err)
	return ok && (me.Number == errInterrupted || me.Number == errStatementTime || me.Number == errExecutionTime)
}

// brokenConn reports whether err is a connection that failed rather than
// a server's answer.
func brokenConn(err error) bool {
	if _, ok := serverError(err); ok {
		return false
	}
	var ne net.Error
	return errors.Is(err, driver.ErrBadConn) || errors.Is(err, mysql.ErrInvalidConn) || errors.As(err, &ne) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed)
}

// mayHaveRun reports whether a call that failed with err may still have
// been carried out by the server.
func mayHaveRun(err error) bool {
	var sent *sentError
	return errors.As(err, &sent)
}

// translate turns an error of call op on resource into this package's
// errors: a missing schema, the end of the token space, or the context's
// end; anything else is wrapped with op and resource.
func translate(ctx context.Context, op, resource string, err error) error {
	if me, ok := serverError(err); ok {
		switch {
		case (me.Number == errNoSuchProcedure || me.Number == errNoSuchTable || me.Number == errWrongArgCount) && strings.Contains(me.Message, "fencekit_lock"):
			return &notMigratedError{op: fmt.Sprintf("%s %q", op, resource), err: err}
		case me.Number == errSignal && strings.Contains(me.Message, "token space exhausted"):
			return fmt.Errorf("mysqllock: %s %q: %w", op, resource, lock.ErrTokensExhausted)
		}
	}
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("mysqllock: %s %q: %w (%w)", op, resource, cerr, err)
	}
	return fmt.Errorf("mysqllock: %s %q: %w", op, resource, err)
}
