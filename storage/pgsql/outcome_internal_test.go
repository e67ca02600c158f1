package pgsql

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// pqError has the methods of lib/pq's *pq.Error that this package reads,
// so that its classification is tested without lib/pq in the module.
type pqError struct {
	code  string
	fatal bool
}

func (e *pqError) Error() string    { return "pq: " + e.code }
func (e *pqError) SQLState() string { return e.code }
func (e *pqError) Fatal() bool      { return e.fatal }

// TestNotAppliedClassification: only an ERROR reply (from either driver),
// pgx's commit-became-rollback and lib/pq's failed-transaction refusal prove
// that a commit applied nothing; a FATAL reply, driver.ErrBadConn, a broken
// connection and a driver's wrapped context error prove nothing.
func TestNotAppliedClassification(t *testing.T) {
	for name, c := range map[string]struct {
		err   error
		known bool
		retry bool
	}{
		"pgx ERROR":              {&pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "23505"}, true, false},
		"pgx serialization":      {&pgconn.PgError{Severity: "ERROR", Code: "40001"}, true, true},
		"pgx FATAL":              {&pgconn.PgError{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "57P01"}, false, false},
		"pgx localized FATAL":    {&pgconn.PgError{Severity: "FATAL", Code: "57P01"}, false, false},
		"pq ERROR":               {&pqError{code: "23505"}, true, false},
		"pq deadlock":            {fmt.Errorf("wrapped: %w", &pqError{code: "40P01"}), true, true},
		"pq FATAL":               {&pqError{code: "57P01", fatal: true}, false, false},
		"pgx commit rollback":    {pgx.ErrTxCommitRollback, true, false},
		"pq failed transaction":  {errors.New(libpqFailedTx), true, false},
		"bad connection":         {driver.ErrBadConn, false, false},
		"EOF":                    {io.ErrUnexpectedEOF, false, false},
		"driver's context error": {fmt.Errorf("timeout: %w", context.DeadlineExceeded), false, false},
	} {
		got, known := notApplied("pgsql: op", c.err)
		if known != c.known {
			t.Errorf("%s: known = %v, want %v", name, known, c.known)
			continue
		}
		if known && (!errors.Is(got, c.err) || errors.Is(got, ErrRetryable) != c.retry) {
			t.Errorf("%s: %v; want it to wrap the error, retryable %v", name, got, c.retry)
		}
	}
}
