package mysql

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/fencekit/fencekit/fence"
)

var (
	// ErrRetryable means the server rolled back a statement or transaction
	// because of a concurrent one: a deadlock (error 1213, the whole
	// transaction rolled back), a lock wait timeout (1205, the statement
	// rolled back; roll back the rest yourself) or, on MariaDB with
	// innodb_snapshot_isolation, a row changed after the snapshot (1020).
	// Nothing of the transaction is kept once it is rolled back; running the
	// whole transaction again may succeed. Errors that match it are
	// [*RetryableError]s and also match the driver's *mysql.MySQLError.
	ErrRetryable = errors.New("mysql: transaction aborted by a concurrent one, retry it")

	// ErrNotMigrated means the guard table (or one of its columns) is
	// missing from the connection's current database: apply fencekit's
	// migrations first (migrations.UpMySQL).
	ErrNotMigrated = errors.New("mysql: fencekit schema not found, apply migrations.UpMySQL first")

	// ErrNullVersion means [Table.UpdateVersion] found the row's version
	// column NULL. A NULL version equals no version a caller can pass, so no
	// retry can succeed: give the column a value (for example, declare it
	// BIGINT NOT NULL DEFAULT 1). Nothing was changed. It does not match
	// [fence.ErrConflict], so [Retry] returns it at once.
	ErrNullVersion = errors.New("mysql: the row's version column is NULL")
)

// Server error numbers this package interprets.
const (
	erLockWaitTimeout = 1205 // ER_LOCK_WAIT_TIMEOUT
	erLockDeadlock    = 1213 // ER_LOCK_DEADLOCK
	erCheckRead       = 1020 // ER_CHECKREAD, MariaDB's snapshot isolation
	erNoSuchTable     = 1146 // ER_NO_SUCH_TABLE
	erBadField        = 1054 // ER_BAD_FIELD_ERROR
	// A check constraint refused a row: a guard table from before
	// migration 3, which refuses the rows that hold no mark yet.
	erConstraintFailed     = 4025 // MariaDB's ER_CONSTRAINT_FAILED
	erCheckConstraintFails = 3819 // MySQL's ER_CHECK_CONSTRAINT_VIOLATED
)

// isDeadlock reports whether err is the server's error 1213: the server
// rolled back the whole transaction.
func isDeadlock(err error) bool {
	var myErr *mysql.MySQLError
	return errors.As(err, &myErr) && myErr.Number == erLockDeadlock
}

// RetryableError is a statement or transaction that the server rolled back
// for a reason that a retry may cure. It matches [ErrRetryable] and wraps the
// server's error.
type RetryableError struct {
	// Err is the server's error, a *mysql.MySQLError numbered 1213, 1205 or
	// 1020.
	Err error
}

// Error describes the server's error and says that a retry may succeed.
func (e *RetryableError) Error() string {
	return "mysql: retryable: " + strings.TrimPrefix(e.Err.Error(), "mysql: ")
}

// Unwrap returns both [ErrRetryable] and the server's error.
func (e *RetryableError) Unwrap() []error { return []error{ErrRetryable, e.Err} }

// invalid returns an error matching fence.ErrInvalid: a call refused before
// anything was sent.
func invalid(format string, args ...any) error {
	return fmt.Errorf("mysql: %w: "+format, append([]any{fence.ErrInvalid}, args...)...)
}

// translate is the one place where driver errors become this package's
// errors. guardSQL says whether the error came from a statement on
// fencekit's own schema.
func translate(err error, guardSQL bool) error {
	if postgresReply(err) {
		return &wrongDatabaseError{err: err}
	}
	var myErr *mysql.MySQLError
	if err == nil || !errors.As(err, &myErr) {
		return err
	}
	switch myErr.Number {
	case erLockDeadlock, erLockWaitTimeout, erCheckRead:
		return &RetryableError{Err: err}
	case erNoSuchTable, erBadField, erConstraintFailed, erCheckConstraintFails:
		if guardSQL {
			return fmt.Errorf("%w: %w", ErrNotMigrated, err)
		}
	}
	return err
}

// postgresReply reports whether err holds a PostgreSQL server's error reply
// (pgx's *pgconn.PgError, lib/pq's *pq.Error: both have a SQLState method,
// which the MySQL driver's errors lack): db is then not a MySQL or MariaDB
// database. It is read from the error alone, so the mix-up costs no round
// trip to tell.
func postgresReply(err error) bool {
	var st interface {
		error
		SQLState() string
	}
	return errors.As(err, &st)
}

// wrongDatabaseError is a PostgreSQL server's refusal of this package's
// MySQL statements: it names the mix-up and wraps the server's error.
type wrongDatabaseError struct{ err error }

func (e *wrongDatabaseError) Error() string {
	return "db is a PostgreSQL database, and storage/mysql speaks MySQL: use storage/pgsql (or storage/postgres with a pgx pool, and migrations.Up) instead: " + e.err.Error()
}

func (e *wrongDatabaseError) Unwrap() error { return e.err }

// commitNotApplied reports whether err, from a COMMIT that may have been
// sent, proves that nothing was applied, and returns it prefixed with op
// (for sqlguard.Commit, which calls everything else an unknown outcome). A
// server error is a COMMIT the server refused, and driver.ErrBadConn one the
// driver never wrote: both leave nothing applied. A context error from
// Commit means database/sql did not send it: go-sql-driver's Commit does not
// watch the context once it writes.
func commitNotApplied(op string, err error) (error, bool) {
	var myErr *mysql.MySQLError
	switch {
	case errors.As(err, &myErr):
		return prefixed(op, translate(err, false)), true
	case errors.Is(err, driver.ErrBadConn),
		errors.Is(err, context.Canceled),
		errors.Is(err, context.DeadlineExceeded):
		return prefixed(op, err), true
	}
	return nil, false
}

// prefixed is msg, which starts with the package's "mysql: ", followed by err:
// it matches err, and says "mysql:" once even when err's own message starts
// with it (a [*RetryableError], an error from a call of this package's
// that a caller's function returned).
func prefixed(msg string, err error) error { return &prefixedError{msg: msg, err: err} }

type prefixedError struct {
	msg string
	err error
}

func (e *prefixedError) Error() string {
	return e.msg + ": " + strings.TrimPrefix(e.err.Error(), "mysql: ")
}

func (e *prefixedError) Unwrap() error { return e.err }
