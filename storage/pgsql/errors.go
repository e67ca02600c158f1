package pgsql

import (
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/pgcore"
	"github.com/fencekit/fencekit/internal/sqlguard"
)

var (
	// ErrRetryable means PostgreSQL aborted the transaction because it could
	// not serialise it with a concurrent one (SQLSTATE 40001) or chose it as
	// a deadlock victim (40P01). Nothing was committed; running the whole
	// transaction again may succeed. Errors that match it are
	// [*RetryableError]s and also match the driver's error (pgx's
	// *pgconn.PgError, lib/pq's *pq.Error).
	ErrRetryable = errors.New("pgsql: transaction aborted by a concurrent one, retry it")

	// ErrNotMigrated means a table or function that fencekit's migrations
	// create is missing from the connection's search_path: apply them first
	// with migrations.Up(ctx, db). Only a server error that names one of
	// fencekit's own objects matches it; a missing table (42P01) or function
	// (42883) of the caller's comes back as the driver's error.
	ErrNotMigrated = errors.New("pgsql: fencekit schema not found, apply migrations.Up first")

	// ErrNullVersion means [Table.UpdateVersion] found the row's version
	// column NULL. A NULL version equals no version a caller can pass, so no
	// retry can succeed: give the column a value (for example, declare it
	// bigint NOT NULL DEFAULT 1). Nothing was changed. It does not match
	// [fence.ErrConflict], so [Retry] returns it at once.
	ErrNullVersion = errors.New("pgsql: the row's version column is NULL")
)

// RetryableError is a transaction that PostgreSQL aborted for a reason that a
// retry may cure. It matches [ErrRetryable] and wraps the driver's error.
type RetryableError struct {
	// Err is the driver's error for SQLSTATE 40001 or 40P01.
	Err error
}

// Error describes the server's error and says that a retry may succeed.
func (e *RetryableError) Error() string {
	return "pgsql: retryable: " + strings.TrimPrefix(e.Err.Error(), "pgsql: ")
}

// Unwrap returns both [ErrRetryable] and the driver's error.
func (e *RetryableError) Unwrap() []error { return []error{ErrRetryable, e.Err} }

// invalid returns an error matching fence.ErrInvalid: a call refused before
// anything was sent.
func invalid(format string, args ...any) error {
	return fmt.Errorf("pgsql: %w: "+format, append([]any{fence.ErrInvalid}, args...)...)
}

// translate is the one place where driver errors become this package's
// errors, whichever driver (pgx's stdlib, lib/pq) returned them.
func translate(err error) error {
	if mysqlReply(err) {
		return &wrongDatabaseError{err: err}
	}
	s, ok := pgcore.AsServerError(err)
	switch {
	case !ok:
		return err
	case pgcore.Retryable(s.Code):
		return &RetryableError{Err: err}
	case pgcore.MissingOwnObject(s):
		return &notMigratedError{err: err}
	}
	return err
}

// mySQLDriverPkg is the package of the MySQL driver's types. It is named,
// not imported, so that importing this package registers no MySQL driver.
const mySQLDriverPkg = "github.com/go-sql-driver/mysql"

// mysqlReply reports whether err holds a MySQL or MariaDB server's error
// reply (the MySQL driver's *MySQLError): db is then not a PostgreSQL
// database. It is read from the error alone, so the mix-up costs no round
// trip to tell.
func mysqlReply(err error) bool {
	return sqlguard.InChain(err, func(e error) bool {
		t := reflect.TypeOf(e)
		for t != nil && t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		return t != nil && t.PkgPath() == mySQLDriverPkg && t.Name() == "MySQLError"
	})
}

// wrongDatabaseError is a MySQL or MariaDB server's refusal of this
// package's PostgreSQL statements: it names the mix-up and wraps the
// server's error.
type wrongDatabaseError struct{ err error }

func (e *wrongDatabaseError) Error() string {
	return "db is a MySQL or MariaDB database, and storage/pgsql speaks PostgreSQL: use storage/mysql (and migrations.UpMySQL) instead: " + e.err.Error()
}

func (e *wrongDatabaseError) Unwrap() error { return e.err }

// notMigratedError is ErrNotMigrated with the server's error.
type notMigratedError struct{ err error }

func (e *notMigratedError) Error() string {
	return "fencekit's schema is missing (run migrations.Up(ctx, db) once per database" +
		pgcore.MigrationNote(e.err.Error()) + "): " + e.err.Error()
}

func (e *notMigratedError) Unwrap() []error { return []error{ErrNotMigrated, e.err} }

// notApplied reports whether err, from a statement that commits (a COMMIT,
// an autocommit write), proves that nothing was applied, and returns it
// translated and prefixed with op. Only these do:
//   - a MySQL or MariaDB server's error reply: db is not PostgreSQL, and
//     the server refused the statement;
//   - a server error reply of severity ERROR: the statement failed and its
//     transaction was aborted. FATAL and PANIC end the session and prove
//     nothing (lib/pq reports them as driver.ErrBadConn, which proves
//     nothing either: it also reports a connection that broke while the
//     reply was awaited that way);
//   - pgx's ErrTxCommitRollback: COMMIT found the transaction aborted;
//   - lib/pq's refusal to commit a transaction it knows failed, which it
//     rolls back instead (it has no exported type; its message is fixed).
func notApplied(op string, err error) (error, bool) {
	if mysqlReply(err) {
		// A MySQL server refused a PostgreSQL statement, as it refuses
		// each of this package's writes: nothing was applied.
		return prefixed(op, translate(err)), true
	}
	if s, ok := pgcore.AsServerError(err); ok && !s.Final {
		return prefixed(op, translate(err)), true
	}
	if errors.Is(err, pgx.ErrTxCommitRollback) || err.Error() == libpqFailedTx {
		return prefixed(op, err), true
	}
	return nil, false
}

// libpqFailedTx is lib/pq's ErrInFailedTransaction's message.
const libpqFailedTx = "pq: Could not complete operation in a failed transaction"

// prefixed is msg, which starts with the package's "pgsql: ", followed by
// err: it matches err, and says "pgsql:" once even when err's own message
// starts with it.
func prefixed(msg string, err error) error { return &prefixedError{msg: msg, err: err} }

type prefixedError struct {
	msg string
	err error
}

func (e *prefixedError) Error() string {
	return e.msg + ": " + strings.TrimPrefix(e.err.Error(), "pgsql: ")
}

func (e *prefixedError) Unwrap() error { return e.err }
