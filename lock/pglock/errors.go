package pglock

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/pgcore"
	"github.com/fencekit/fencekit/lock"
)

var (
	// ErrNotMigrated means the lock's tables or functions are missing from
	// the connection's search_path: apply migration 00006_fencekit_lock
	// with migrations.UpPool (or migrations.Up) first. Nothing was changed.
	// The error's message names the call that found it.
	ErrNotMigrated = errors.New("pglock: the lock's schema is missing, run migrations.UpPool(ctx, pool) once per database (migration 00006_fencekit_lock)")
)

// codeTokensExhausted is what fencekit_lock_next raises past 2^53 - 1.
const codeTokensExhausted = "FK002"

// invalidError is this package's message for an invalid argument; it
// matches [fence.ErrInvalid].
type invalidError struct{ msg string }

func (e *invalidError) Error() string { return "pglock: invalid argument: " + e.msg }
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
	return "pglock: " + e.op + ": the lock's schema is missing (migration 00006_fencekit_lock: run migrations.UpPool(ctx, pool) or migrations.Up(ctx, db) once per database): " + e.err.Error()
}

func (e *notMigratedError) Unwrap() []error { return []error{ErrNotMigrated, e.err} }

// translate turns a driver error from call op on resource into this
// package's errors: a missing schema, the end of the token space, or the
// context's end; anything else is wrapped with op and resource.
func translate(ctx context.Context, op, resource string, err error) error {
	if s, ok := pgcore.AsServerError(err); ok {
		switch {
		case (s.Code == pgcore.CodeUndefinedTable || s.Code == pgcore.CodeUndefinedFunction) && strings.Contains(s.Message, "fencekit_lock"):
			return &notMigratedError{op: fmt.Sprintf("%s %q", op, resource), err: err}
		case s.Code == codeTokensExhausted:
			return fmt.Errorf("pglock: %s %q: %w", op, resource, lock.ErrTokensExhausted)
		case ctx.Err() == nil && cutByTimeout(err):
			name := "statement_timeout"
			if s.Code == codeLockNotAvailable {
				name = "lock_timeout"
			}
			return fmt.Errorf("pglock: %s %q: cut by the %s set on the database, role or connection, with nothing changed (lift it for the lock's pool): %w", op, resource, name, err)
		}
	}
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("pglock: %s %q: %w (%w)", op, resource, cerr, err)
	}
	return fmt.Errorf("pglock: %s %q: %w", op, resource, err)
}

// mayHaveRun reports whether a call that failed with err may still have
// been carried out by the server: the request may have been sent and its
// reply lost (a connection cut, a context that ended mid-call). A server
// error reply, or a failure before anything was sent, says it was not.
func mayHaveRun(err error) bool {
	var sent *sentError
	if errors.As(err, &sent) {
		return true
	}
	if s, ok := pgcore.AsServerError(err); ok {
		// An ERROR aborted the statement; a FATAL one ended the session,
		// which says nothing of what it had committed.
		return s.Final
	}
	return !pgconn.SafeToRetry(err)
}

// serverError is pgcore.AsServerError, named for this package's callers.
func serverError(err error) (pgcore.ServerError, bool) { return pgcore.AsServerError(err) }
