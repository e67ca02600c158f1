package pgsql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"testing"
	"weak"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/fencekit/fencekit/internal/harness/testenv"
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

// TestPgxStdlibRecognised: InTx commits in the caller's goroutine only on a
// driver it knows watches the context; pgx's stdlib is recognised however
// the *sql.DB was opened, and a pool of another driver is not.
func TestPgxStdlibRecognised(t *testing.T) {
	const u = "postgres://u@127.0.0.1:1/db"
	byName, err := sql.Open("pgx", u)
	if err != nil {
		t.Fatal(err)
	}
	defer byName.Close()
	cfg, err := pgx.ParseConfig(u)
	if err != nil {
		t.Fatal(err)
	}
	byConfig := stdlib.OpenDB(*cfg)
	defer byConfig.Close()
	for name, db := range map[string]*sql.DB{"sql.Open": byName, "stdlib.OpenDB": byConfig} {
		if !pgxStdlib(db) {
			t.Errorf("%s: pgx's stdlib not recognised (driver %T)", name, db.Driver())
		}
	}
	other := sql.OpenDB(otherConnector{})
	defer other.Close()
	if pgxStdlib(other) {
		t.Errorf("driver %T taken for pgx's stdlib", other.Driver())
	}
}

// otherConnector stands for a driver that is not pgx's; nothing connects.
type otherConnector struct{}

func (otherConnector) Connect(context.Context) (driver.Conn, error) {
	return nil, errors.New("not connecting")
}
func (otherConnector) Driver() driver.Driver { return otherDriver{} }

type otherDriver struct{}

func (otherDriver) Open(string) (driver.Conn, error) { return nil, errors.New("not connecting") }

// TestGuardForm: InTx and Once send the guard's fast path only where the
// driver prepares it once per connection (pgx's stdlib with its statement
// cache), the function's call with arguments on pgx's stdlib otherwise,
// and its arguments in its text on other drivers; the form found for a
// *sql.DB is kept.
func TestGuardForm(t *testing.T) {
	u := testenv.PostgresURL(t)
	ctx := context.Background()
	for mode, want := range map[string]guardForm{
		"": guardLocked,
		"&default_query_exec_mode=cache_statement": guardLocked,
		"&default_query_exec_mode=simple_protocol": guardArgs,
		"&default_query_exec_mode=exec":            guardArgs,
		"&default_query_exec_mode=cache_describe":  guardArgs,
	} {
		db, err := sql.Open("pgx", u+mode)
		if err != nil {
			t.Fatal(err)
		}
		if got := guardFormOf(ctx, db); got != want {
			t.Errorf("pgx stdlib%s: form %d, want %d", mode, got, want)
		}
		if _, kept := guardForms.Load(weak.Make(db)); !kept {
			t.Errorf("pgx stdlib%s: form not kept", mode)
		}
		_ = db.Close()
	}
	other := sql.OpenDB(otherConnector{})
	defer other.Close()
	if got := guardFormOf(ctx, other); got != guardArgs {
		t.Errorf("another driver: form %d, want %d (the function's call with arguments)", got, guardArgs)
	}
}
