package postgres

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/pgcore"
)

var (
	// ErrRetryable means PostgreSQL aborted the transaction because it could
	// not serialise it with a concurrent one (SQLSTATE 40001) or chose it as
	// a deadlock victim (40P01). Nothing was committed; running the whole
	// transaction again may succeed. Errors that match it are
	// [*RetryableError]s and also match the driver's *pgconn.PgError.
	ErrRetryable = errors.New("postgres: transaction aborted by a concurrent one, retry it")

	// ErrNotMigrated means a table or function that fencekit's migrations
	// create is missing from the connection's search_path: apply the
	// migrations first (see the migrations package). Only a server error
	// that names one of fencekit's own objects matches it; a missing table
	// (42P01) or function (42883) of the caller's comes back as the
	// statement's own *pgconn.PgError.
	//
	// The error's message names the migrations package's function for the
	// caller's handle: UpPool for a *pgxpool.Pool, and both UpPool and Up
	// (which takes a *sql.DB) otherwise.
	ErrNotMigrated = errors.New("postgres: fencekit schema not found, apply the migrations package's migrations first")

	// ErrNullVersion means [Table.UpdateVersion] found the row's version
	// column NULL. A NULL version equals no version a caller can pass, so no
	// retry can succeed: give the column a value (for example, declare it
	// bigint NOT NULL DEFAULT 1). Nothing was changed. It does not match
	// [fence.ErrConflict], so [Retry] returns it at once.
	ErrNullVersion = errors.New("postgres: the row's version column is NULL")
)

// This package's own message for the module-wide sentinel: callers match
// [fence.ErrInvalid].
var (
	// errInvalidArgument means a call was refused before anything was sent:
	// a nil context, database handle or function; an empty table or column
	// name, or one holding a NUL byte; a [Table] whose key, token, holder and
	// version columns are not four different columns, or a value on one of
	// them or on a column named twice; a resource named twice in [GuardAll];
	// a resource for [HighWater] that no fence could carry; a key for [Once]
	// or [LookupOnce] that is empty, longer than [MaxOnceKeyLen], not valid
	// UTF-8 or holding a NUL byte. (Invalid fences,
	// resources too long included, are refused with [fence.ErrInvalid].)
	// It matches [fence.ErrInvalid], as every invalid-argument error of this
	// module does.
	errInvalidArgument error = &invalidError{}
)

// invalidError is errInvalidArgument: this package's name for an invalid
// argument, which also matches the module-wide [fence.ErrInvalid].
type invalidError struct{}

func (*invalidError) Error() string { return "postgres: invalid argument" }
func (*invalidError) Unwrap() error { return fence.ErrInvalid }

// SQLSTATE codes this package interprets.
const (
	codeSerializationFailure = pgcore.CodeSerializationFailure
	codeDeadlockDetected     = pgcore.CodeDeadlockDetected
	codeUndefinedTable       = pgcore.CodeUndefinedTable
	codeUndefinedFunction    = pgcore.CodeUndefinedFunction
	codeUndefinedColumn      = pgcore.CodeUndefinedColumn
)

// CodeStale is the SQLSTATE that the fencekit_guard_admit function raises for
// a stale fence, aborting the transaction it runs in. Its DETAIL is a JSON
// object {"token": ..., "holder": ...} holding the high-water mark the fence
// lost to; this package turns it into a [*fence.StaleError].
const CodeStale = pgcore.CodeStale

// RetryableError is a transaction that PostgreSQL aborted for a reason that a
// retry may cure. It matches [ErrRetryable] and wraps the server's error.
type RetryableError struct {
	// Err is the server's error, usually a *pgconn.PgError with Code 40001
	// or 40P01.
	Err error
}

// Error describes the server's error and says that a retry may succeed.
func (e *RetryableError) Error() string {
	return "postgres: retryable: " + strings.TrimPrefix(e.Err.Error(), "postgres: ")
}

// Unwrap returns both [ErrRetryable] and the server's error.
func (e *RetryableError) Unwrap() []error { return []error{ErrRetryable, e.Err} }

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errInvalidArgument}, args...)...)
}

// translate is the one place where driver errors become this package's
// errors. f is the fence the failed operation presented, used to rebuild a
// stale rejection raised by the server.
func translate(err error, f fence.Fence) error {
	if err == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	switch pgErr.Code {
	case codeSerializationFailure, codeDeadlockDetected:
		return &RetryableError{Err: err}
	case CodeStale:
		mark, merr := pgcore.StaleMark(f.Resource, pgErr.Detail)
		if merr != nil {
			return fmt.Errorf("%w (%v)", fence.ErrStale, merr)
		}
		return &fence.StaleError{Fence: f, HighWater: mark}
	case codeUndefinedTable, codeUndefinedFunction:
		// A pipelined batch prepares the caller's statements with the guard,
		// so a table or function of theirs that is missing can fail the
		// guard's step: only the name in the message tells whose it is.
		if namesOwnObject(pgErr.Message) {
			return &notMigratedError{apply: applyAny, err: err}
		}
	}
	return err
}

// How to apply the migrations, for the handle a caller passed: a pool's user
// has UpPool at hand, and cannot call Up without opening a *sql.DB.
const (
	applyPool = "run migrations.UpPool(ctx, pool) once per database"
	applyAny  = "run migrations.UpPool with a pgx pool, or migrations.Up with a *sql.DB, once per database"
)

// notMigratedError is ErrNotMigrated with the server's error. Its message
// carries no "postgres:" prefix: the call that returns it adds its own.
type notMigratedError struct {
	apply string // applyPool or applyAny
	err   error
}

func (e *notMigratedError) Error() string {
	return "fencekit's schema is missing (" + e.apply + pgcore.MigrationNote(e.err.Error()) + "): " + e.err.Error()
}

func (e *notMigratedError) Unwrap() []error { return []error{ErrNotMigrated, e.err} }

// forHandle rewrites a missing-schema error in err, returned by the call op,
// to name the migrations function that fits db, the handle the caller
// passed. The error is built anew because a wrapping error's message is
// fixed when it is made.
func forHandle(op string, err error, db any) error {
	var nm *notMigratedError
	if _, isPool := db.(*pgxpool.Pool); !isPool || !errors.As(err, &nm) {
		return err
	}
	return prefixed(fmt.Sprintf("postgres: %s", op), &notMigratedError{apply: applyPool, err: nm.err})
}

// namesOwnObject reports whether msg, a server error's message, names one
// of the tables and functions the migrations create.
func namesOwnObject(msg string) bool { return pgcore.NamesOwnObject(msg) }

// prefixed is msg, which starts with the package's "postgres: ", followed by err:
// it matches err, and says "postgres:" once even when err's own message starts
// with it (a [*RetryableError], an error from a call of this package's
// that a caller's function returned).
func prefixed(msg string, err error) error { return &prefixedError{msg: msg, err: err} }

type prefixedError struct {
	msg string
	err error
}

func (e *prefixedError) Error() string {
	return e.msg + ": " + strings.TrimPrefix(e.err.Error(), "postgres: ")
}

func (e *prefixedError) Unwrap() error { return e.err }
