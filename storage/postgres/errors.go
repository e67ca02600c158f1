package postgres

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fencekit/fencekit/fence"
)

var (
	// ErrRetryable means PostgreSQL aborted the transaction because it could
	// not serialise it with a concurrent one (SQLSTATE 40001) or chose it as
	// a deadlock victim (40P01). Nothing was committed; running the whole
	// transaction again may succeed. Errors that match it are
	// [*RetryableError]s and also match the driver's *pgconn.PgError.
	ErrRetryable = errors.New("postgres: transaction aborted by a concurrent one, retry it")

	// ErrNotMigrated means the guard table or function is missing from the
	// connection's search_path: apply fencekit's migrations first (see the
	// migrations package).
	ErrNotMigrated = errors.New("postgres: fencekit schema not found, apply migrations.Up first")

	// ErrNullVersion means [Table.UpdateVersion] found the row's version
	// column NULL. A NULL version equals no version a caller can pass, so no
	// retry can succeed: give the column a value (for example, declare it
	// bigint NOT NULL DEFAULT 1). Nothing was changed. It does not match
	// [fence.ErrConflict], so [Retry] returns it at once.
	ErrNullVersion = errors.New("postgres: the row's version column is NULL")

	// ErrInvalidArgument means a call was refused before anything was sent:
	// a nil context, database handle or function; an empty table or column
	// name, or one holding a NUL byte; a [Table] whose key, token, holder and
	// version columns are not four different columns, or a value on one of
	// them or on a column named twice; a resource named twice in [GuardAll];
	// a resource for [HighWater] that no fence could carry. (Invalid fences,
	// resources too long included, are refused with [fence.ErrInvalidFence].)
	// It matches [fence.ErrInvalid], as every invalid-argument error of this
	// module does.
	ErrInvalidArgument error = &invalidError{}
)

// invalidError is ErrInvalidArgument: this package's name for an invalid
// argument, which also matches the module-wide [fence.ErrInvalid].
type invalidError struct{}

func (*invalidError) Error() string { return "postgres: invalid argument" }
func (*invalidError) Unwrap() error { return fence.ErrInvalid }

// SQLSTATE codes this package interprets.
const (
	codeSerializationFailure = "40001"
	codeDeadlockDetected     = "40P01"
	codeUndefinedTable       = "42P01"
	codeUndefinedFunction    = "42883"
)

// CodeStale is the SQLSTATE that the fencekit_guard_admit function raises for
// a stale fence, aborting the transaction it runs in. Its DETAIL is a JSON
// object {"token": ..., "holder": ...} holding the high-water mark the fence
// lost to; this package turns it into a [*fence.StaleError].
const CodeStale = "FK001"

// RetryableError is a transaction that PostgreSQL aborted for a reason that a
// retry may cure. It matches [ErrRetryable] and wraps the server's error.
type RetryableError struct {
	// Err is the server's error, usually a *pgconn.PgError with Code 40001
	// or 40P01.
	Err error
}

// Error describes the server's error and says that a retry may succeed.
func (e *RetryableError) Error() string {
	return "postgres: retryable: " + e.Err.Error()
}

// Unwrap returns both [ErrRetryable] and the server's error.
func (e *RetryableError) Unwrap() []error { return []error{ErrRetryable, e.Err} }

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidArgument}, args...)...)
}

// translate is the one place where driver errors become this package's
// errors. f is the fence the failed operation presented, used to rebuild a
// stale rejection raised by the server; guardSQL says whether the error came
// from a statement on fencekit's own schema.
func translate(err error, f fence.Fence, guardSQL bool) error {
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
		var mark struct {
			Token  int64  `json:"token"`
			Holder string `json:"holder"`
		}
		if jerr := json.Unmarshal([]byte(pgErr.Detail), &mark); jerr != nil {
			return fmt.Errorf("%w (unreadable mark %q: %v)", fence.ErrStale, pgErr.Detail, jerr)
		}
		return &fence.StaleError{
			Fence:     f,
			HighWater: fence.Fence{Resource: f.Resource, Token: fence.Token(mark.Token), Holder: mark.Holder},
		}
	case codeUndefinedTable, codeUndefinedFunction:
		if guardSQL {
			return fmt.Errorf("%w: %w", ErrNotMigrated, err)
		}
	}
	return err
}
