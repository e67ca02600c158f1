package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fencekit/fencekit/fence"
)

// Which errors prove that nothing was applied. The real servers' cases are in
// outcome_test.go; this covers replies that are hard to provoke on time, such
// as a FATAL one while COMMIT waits for a synchronous standby.
func TestNotAppliedClassification(t *testing.T) {
	cases := []struct {
		name       string
		err        error
		notApplied bool
	}{
		{"ERROR reply", &pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "23505"}, true},
		{"ERROR reply, localized severity only", &pgconn.PgError{Severity: "ERROR", Code: "22012"}, true},
		{"ERROR reply, wrapped", fmt.Errorf("postgres: commit: %w", &pgconn.PgError{Severity: "FEHLER", SeverityUnlocalized: "ERROR"}), true},
		{"FATAL reply: the backend was terminated", &pgconn.PgError{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "57P01"}, false},
		{"PANIC reply", &pgconn.PgError{Severity: "PANIC", SeverityUnlocalized: "PANIC"}, false},
		{"COMMIT rolled back", fmt.Errorf("postgres: commit: %w", pgx.ErrTxCommitRollback), true},
		{"batch failed while prepared", fmt.Errorf("x: %w", pgx.ErrPreprocessingBatch{}), true},
		{"connection cut while reading", io.ErrUnexpectedEOF, false},
		{"context ended while reading", context.Canceled, false},
		{"deadline passed while reading", context.DeadlineExceeded, false},
	}
	for _, c := range cases {
		if got := notApplied(c.err); got != c.notApplied {
			t.Errorf("%s: notApplied = %v, want %v", c.name, got, c.notApplied)
		}
		err := unknownOutcome("op", c.err)
		if unknown := errors.Is(err, fence.ErrOutcomeUnknown); unknown == c.notApplied {
			t.Errorf("%s: unknownOutcome = %v", c.name, err)
		}
		if !errors.Is(err, c.err) {
			t.Errorf("%s: %v no longer matches its cause", c.name, err)
		}
	}
}
