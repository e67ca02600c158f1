package postgres_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/storage/postgres"
)

// TestTableRefusesNullKey: a NULL key matches no row, and a nullable
// unique column holds any number of NULLs, so an Upsert with one inserts a
// new row every time: token 1 after token 9 included. Every Table call
// refuses it before sending, naming the call, whichever form the NULL
// takes, with the statement cache and under the simple protocol.
func TestTableRefusesNullKey(t *testing.T) {
	ctx, pool := setup(t)
	mustExec(t, ctx, pool, `CREATE TABLE nk (id serial PRIMARY KEY, k text NULL UNIQUE, v int, fence_token bigint, fence_holder text, version bigint NOT NULL DEFAULT 1)`)
	tbl := postgres.Table{Name: pgx.Identifier{"nk"}, Key: "k"}
	var nilPtr *string
	var nilText *pgtype.Text
	keys := map[string]any{
		"nil":              nil,
		"nil *string":      nilPtr,
		"sql.NullString":   sql.NullString{},
		"sql.Null[int64]":  sql.Null[int64]{},
		"pgtype.Text":      pgtype.Text{},
		"nil *pgtype.Text": nilText,
	}
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
		conn := withMode(t, ctx, pool, mode)
		for kname, key := range keys {
			for name, call := range map[string]func(ctx context.Context, f fence.Fence) error{
				"Table.Update": func(ctx context.Context, f fence.Fence) error {
					return tbl.Update(ctx, conn, f, key, postgres.Set("v", 1))
				},
				"Table.Upsert": func(ctx context.Context, f fence.Fence) error {
					return tbl.Upsert(ctx, conn, f, key, postgres.Set("v", 1))
				},
				"Table.UpdateVersion": func(ctx context.Context, _ fence.Fence) error {
					_, err := tbl.UpdateVersion(ctx, conn, key, 1, postgres.Set("v", 1))
					return err
				},
			} {
				// The newer fence first: were the key admitted, the older
				// one would land after it.
				for _, tok := range []int64{9, 1} {
					err := call(ctx, fenceOf("nk", tok, "h"))
					if !errors.Is(err, fence.ErrInvalid) || !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), "NULL key") {
						t.Errorf("%v: %s with key %s (token %d) = %v, want fence.ErrInvalid naming the call and the NULL key", mode, name, kname, tok, err)
					}
				}
			}
		}
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM nk`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows inserted (%v), want none", n, err)
	}
}

// withMode returns a pool on pool's database (and schema) whose connections
// send statements in mode.
func withMode(t testing.TB, ctx context.Context, pool *pgxpool.Pool, mode pgx.QueryExecMode) *pgxpool.Pool {
	t.Helper()
	cfg := pool.Config()
	cfg.ConnConfig.DefaultQueryExecMode = mode
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}
