package postgres_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/storage/postgres"
)

// On a migrated schema, a statement of the caller's that names a missing
// table (42P01) or function (42883) fails as itself, not as ErrNotMigrated:
// only errors that name fencekit's own objects mean the migrations are
// missing. In a pipelined batch the caller's statement is prepared together
// with the guard, so its failure arrives as the guard's result.
func TestCallersMissingObjectsAreNotErrNotMigrated(t *testing.T) {
	ctx, pool := setup(t)
	f := fenceOf("r", 1, "h")
	cases := map[string]struct {
		sql  string
		code string
	}{
		"missing table":    {`UPDATE no_such_table SET n = 1`, "42P01"},
		"missing function": {`SELECT no_such_function(1)`, "42883"},
	}
	for name, c := range cases {
		stmt := postgres.Statement{SQL: c.sql}
		calls := map[string]func() error{
			"Exec": func() error {
				_, err := postgres.Exec(ctx, pool, f, stmt)
				return err
			},
			"Query": func() error {
				return postgres.Query(ctx, pool, f, stmt, func(pgx.Rows) error { return nil })
			},
			"InTx": func() error {
				return postgres.InTx(ctx, pool, pgx.TxOptions{}, f, func(ctx context.Context, tx pgx.Tx) error {
					_, err := tx.Exec(ctx, c.sql)
					return err
				})
			},
			"Table.Update": func() error {
				return postgres.Table{Name: pgx.Identifier{"no_such_table"}, Key: "id"}.Update(ctx, pool, f, 1)
			},
		}
		for cname, call := range calls {
			if cname == "Table.Update" && c.code != "42P01" {
				continue
			}
			err := call()
			var pgErr *pgconn.PgError
			if errors.Is(err, postgres.ErrNotMigrated) || !errors.As(err, &pgErr) || pgErr.Code != c.code {
				t.Errorf("%s, %s: err = %v, want the statement's own SQLSTATE %s and not ErrNotMigrated", name, cname, err, c.code)
			}
		}
	}
}

// Without the migrations, every entry point that needs fencekit's objects
// says so.
func TestNotMigratedNamesFencekitObjects(t *testing.T) {
	pool := testenv.Postgres(t)
	ctx := context.Background()
	f := fenceOf("r", 1, "h")
	stmt := postgres.Statement{SQL: `SELECT 1`}
	calls := map[string]func() error{
		"Exec": func() error { _, err := postgres.Exec(ctx, pool, f, stmt); return err },
		"Query": func() error {
			return postgres.Query(ctx, pool, f, stmt, func(pgx.Rows) error { return nil })
		},
		"InTx": func() error {
			return postgres.InTx(ctx, pool, pgx.TxOptions{}, f, func(context.Context, pgx.Tx) error { return nil })
		},
		"HighWater": func() error { _, err := postgres.HighWater(ctx, pool, "r"); return err },
	}
	for name, call := range calls {
		if err := call(); !errors.Is(err, postgres.ErrNotMigrated) {
			t.Errorf("%s without migrations = %v, want ErrNotMigrated", name, err)
		}
	}
}
