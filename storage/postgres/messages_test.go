package postgres_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/storage/postgres"
)

// TestNotMigratedMessage: without the migrations, the error says so once,
// under one "postgres:" prefix, and names the function that applies them for
// the caller's handle: UpPool to a pool's user, who cannot call Up without a
// *sql.DB; both to a caller with a connection or a transaction.
func TestNotMigratedMessage(t *testing.T) {
	pool := testenv.Postgres(t)
	ctx := context.Background()
	f := fenceOf("r", 1, "h")
	stmt := postgres.Statement{SQL: `SELECT 1`}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	calls := map[string]struct {
		call func() error
		pool bool
	}{
		"Exec": {func() error { _, err := postgres.Exec(ctx, pool, f, stmt); return err }, true},
		"Query": {func() error {
			return postgres.Query(ctx, pool, f, stmt, func(pgx.Rows) error { return nil })
		}, true},
		"InTx": {func() error {
			return postgres.InTx(ctx, pool, pgx.TxOptions{}, f, func(context.Context, pgx.Tx) error { return nil })
		}, true},
		"HighWater": {func() error { _, err := postgres.HighWater(ctx, pool, "r"); return err }, true},
		"Once": {func() (err error) {
			_, err = postgres.Once(ctx, pool, f, "k", func(context.Context, pgx.Tx) error { return nil })
			return err
		}, true},
		"LookupOnce":           {func() (err error) { _, err = postgres.LookupOnce(ctx, pool, "k"); return err }, true},
		"Exec on a connection": {func() error { _, err := postgres.Exec(ctx, conn.Conn(), f, stmt); return err }, false},
		"Guard in a transaction": {func() error {
			tx, err := conn.Begin(ctx)
			if err != nil {
				return err
			}
			defer tx.Rollback(ctx)
			return postgres.Guard(ctx, tx, f)
		}, false},
	}
	for name, c := range calls {
		err := c.call()
		if !errors.Is(err, postgres.ErrNotMigrated) {
			t.Errorf("%s = %v, want ErrNotMigrated", name, err)
			continue
		}
		msg := err.Error()
		if n := strings.Count(msg, "postgres:"); n != 1 {
			t.Errorf("%s: %q says \"postgres:\" %d times, want once", name, msg, n)
		}
		if !strings.Contains(msg, "migrations.UpPool") {
			t.Errorf("%s: %q does not name migrations.UpPool", name, msg)
		}
		if sqlDB := strings.Contains(msg, "migrations.Up with a *sql.DB"); sqlDB == c.pool {
			t.Errorf("%s: %q: naming migrations.Up for a *sql.DB is %v, want %v", name, msg, sqlDB, !c.pool)
		}
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42P01" && pgErr.Code != "42883" {
			t.Errorf("%s: %v does not carry the server's error", name, err)
		}
	}
}

// TestTableWithoutMarkColumns: a fenced write to a table that lacks the row
// mark's columns says which ones are missing and how to add them, rather
// than the server's bare "column does not exist"; a column of the caller's
// that is missing still comes back as the server's error.
func TestTableWithoutMarkColumns(t *testing.T) {
	ctx, pool := setup(t)
	mustExec(t, ctx, pool, `CREATE TABLE bare (id int PRIMARY KEY, state text)`)
	mustExec(t, ctx, pool, `CREATE TABLE half (id int PRIMARY KEY, state text, fence_token bigint)`)
	mustExec(t, ctx, pool, `INSERT INTO bare VALUES (1, 'new')`)
	mustExec(t, ctx, pool, `INSERT INTO half VALUES (1, 'new')`)
	f := fenceOf("job:1", 1, "h")
	for _, c := range []struct {
		table   string
		missing []string
		present []string
	}{
		{"bare", []string{"fence_token", "fence_holder"}, nil},
		{"half", []string{"fence_holder"}, []string{"fence_token bigint"}},
	} {
		tbl := postgres.Table{Name: pgx.Identifier{c.table}, Key: "id"}
		calls := map[string]func() error{
			"Update": func() error { return tbl.Update(ctx, pool, f, 1, postgres.Set("state", "done")) },
			"Upsert": func() error { return tbl.Upsert(ctx, pool, f, 1, postgres.Set("state", "done")) },
		}
		for name, call := range calls {
			err := call()
			if err == nil {
				t.Fatalf("%s %s: no error", c.table, name)
			}
			msg := err.Error()
			for _, col := range c.missing {
				if !strings.Contains(msg, "ADD COLUMN IF NOT EXISTS \""+col+"\"") {
					t.Errorf("%s %s: %q does not say how to add %s", c.table, name, msg, col)
				}
			}
			for _, col := range c.present {
				if strings.Contains(msg, "ADD COLUMN IF NOT EXISTS \""+strings.Fields(col)[0]+"\"") {
					t.Errorf("%s %s: %q asks to add %s, which the table has", c.table, name, msg, col)
				}
			}
			if !strings.Contains(msg, "missing "+strings.Join(c.missing, ", ")) {
				t.Errorf("%s %s: %q does not name the missing columns %v", c.table, name, msg, c.missing)
			}
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "42703" {
				t.Errorf("%s %s: %v does not carry the server's error", c.table, name, err)
			}
			if errors.Is(err, fence.ErrOutcomeUnknown) {
				t.Errorf("%s %s: %v reports an unknown outcome for a refused statement", c.table, name, err)
			}
		}
	}

	// The caller's own missing column is the server's to report.
	mustExec(t, ctx, pool, `CREATE TABLE whole (id int PRIMARY KEY, fence_token bigint, fence_holder text)`)
	mustExec(t, ctx, pool, `INSERT INTO whole (id) VALUES (1)`)
	err := postgres.Table{Name: pgx.Identifier{"whole"}, Key: "id"}.Update(ctx, pool, f, 1, postgres.Set("nope", 1))
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42703" || strings.Contains(err.Error(), "ADD COLUMN") {
		t.Errorf("Update of a missing value column = %v, want the server's own error", err)
	}

	// In a transaction the statement's failure aborts it, so the message
	// cannot look the columns up: it names the one the server named and
	// adds both, each only if missing.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	err = postgres.Table{Name: pgx.Identifier{"bare"}, Key: "id"}.Update(ctx, tx, f, 1)
	if msg := errText(err); !strings.Contains(msg, `ADD COLUMN IF NOT EXISTS "fence_token" bigint, ADD COLUMN IF NOT EXISTS "fence_holder" text`) || !strings.Contains(msg, "missing fence_token") {
		t.Errorf("Update in a transaction = %q, want both columns' ALTER and the missing one named", msg)
	}
}

// TestStaleErrorsNamePostgres: every stale refusal says it came from
// PostgreSQL, as the Redis store's say they came from it, and still
// matches fence.ErrStale with the mark it lost to.
func TestStaleErrorsNamePostgres(t *testing.T) {
	ctx, pool := setup(t)
	mustExec(t, ctx, pool, `CREATE TABLE jobs (id int PRIMARY KEY, state text, fence_token bigint, fence_holder text)`)
	mustExec(t, ctx, pool, `INSERT INTO jobs (id) VALUES (1)`)
	newer, older := fenceOf("r", 9, "new"), fenceOf("r", 3, "old")
	raise(t, ctx, pool, newer)
	jobs := postgres.Table{Name: pgx.Identifier{"jobs"}, Key: "id"}
	if err := jobs.Update(ctx, pool, newer, 1); err != nil {
		t.Fatal(err)
	}
	stmt := postgres.Statement{SQL: `SELECT 1`}
	calls := map[string]func() error{
		"Exec": func() error { _, err := postgres.Exec(ctx, pool, older, stmt); return err },
		"Query": func() error {
			return postgres.Query(ctx, pool, older, stmt, func(pgx.Rows) error { return nil })
		},
		"InTx": func() error {
			return postgres.InTx(ctx, pool, pgx.TxOptions{}, older, func(context.Context, pgx.Tx) error { return nil })
		},
		"Once": func() (err error) {
			_, err = postgres.Once(ctx, pool, older, "k", func(context.Context, pgx.Tx) error { return nil })
			return err
		},
		"GuardAll": func() error {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer tx.Rollback(ctx)
			return postgres.GuardAll(ctx, tx, older)
		},
		"Table.Update": func() error { return jobs.Update(ctx, pool, older, 1) },
		"Table.Upsert": func() error { return jobs.Upsert(ctx, pool, older, 1) },
	}
	for name, call := range calls {
		err := call()
		wantStale(t, err, newer)
		if msg := err.Error(); !strings.HasPrefix(msg, "postgres: ") || strings.Count(msg, "postgres:") != 1 {
			t.Errorf("%s: %q, want one \"postgres: \" prefix", name, msg)
		}
	}
}

func errText(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// TestRetryableSaysPostgresOnce: a serialization failure reported by a
// statement in a batch, or by a caller's function, says "postgres:" once
// however many calls wrapped it.
func TestRetryableSaysPostgresOnce(t *testing.T) {
	ctx, pool := setup(t)
	f := fenceOf("r", 1, "h")
	raise := `DO $$ BEGIN RAISE EXCEPTION 'could not serialize' USING ERRCODE = '40001'; END $$`
	_, execErr := postgres.Exec(ctx, pool, f, postgres.Statement{SQL: raise})
	inTxErr := postgres.InTx(ctx, pool, pgx.TxOptions{}, f, func(ctx context.Context, tx pgx.Tx) error {
		_, err := postgres.Exec(ctx, tx, f, postgres.Statement{SQL: raise})
		return err
	})
	for name, err := range map[string]error{"Exec": execErr, "Exec inside InTx": inTxErr} {
		if !errors.Is(err, postgres.ErrRetryable) {
			t.Fatalf("%s = %v, want ErrRetryable", name, err)
		}
		if msg := err.Error(); !strings.HasPrefix(msg, "postgres: ") || strings.Count(msg, "postgres:") != 1 {
			t.Errorf("%s: %q, want one \"postgres: \" prefix", name, msg)
		}
	}
}
