package postgres_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/storage/postgres"
)

// TestUnencodableArgumentIsNotUnknown: an argument that pgx cannot encode
// fails the call before the statement is sent, so the outcome is known:
// nothing was written. A Table call on a pool or a connection must say so
// plainly, not that the outcome is unknown, with the statement cache and
// under the simple protocol.
func TestUnencodableArgumentIsNotUnknown(t *testing.T) {
	ctx, pool := setup(t)
	mustExec(t, ctx, pool, `ALTER TABLE counter ADD COLUMN version bigint NOT NULL DEFAULT 1, ADD COLUMN fence_token bigint, ADD COLUMN fence_holder text`)
	tbl := postgres.Table{Name: pgx.Identifier{"counter"}, Key: "id"}
	bad := struct{ X int }{1}
	simple := withMode(t, ctx, pool, pgx.QueryExecModeSimpleProtocol)
	conn := acquire(t, ctx, pool)
	for hname, q := range map[string]postgres.Querier{"pool": pool, "conn": conn, "simple protocol pool": simple} {
		for name, call := range map[string]func(ctx context.Context) error{
			"Table.Update": func(ctx context.Context) error {
				return tbl.Update(ctx, q, fenceOf("c", 1, "h"), 1, postgres.Set("n", bad))
			},
			"Table.Upsert": func(ctx context.Context) error {
				return tbl.Upsert(ctx, q, fenceOf("c", 1, "h"), 1, postgres.Set("n", bad))
			},
			"Table.UpdateVersion": func(ctx context.Context) error {
				_, err := tbl.UpdateVersion(ctx, q, 1, 1, postgres.Set("n", bad))
				return err
			},
		} {
			err := call(ctx)
			if err == nil || errors.Is(err, fence.ErrOutcomeUnknown) {
				t.Errorf("%s on a %s with an argument pgx cannot encode = %v, want a known outcome", name, hname, err)
			}
		}
	}
	// The pipelined calls: the batch's statements are encoded before any
	// of it is sent.
	stmt := postgres.Statement{SQL: `UPDATE counter SET n = $1 WHERE id = 1`, Args: []any{bad}}
	for hname, b := range map[string]postgres.Batcher{"pool": pool, "simple protocol pool": simple} {
		if _, err := postgres.Exec(ctx, b, fenceOf("c", 1, "h"), stmt); err == nil || errors.Is(err, fence.ErrOutcomeUnknown) {
			t.Errorf("Exec on a %s with an argument pgx cannot encode = %v, want a known outcome", hname, err)
		}
		err := postgres.Query(ctx, b, fenceOf("c", 1, "h"), stmt, func(pgx.Rows) error { return nil })
		if err == nil || errors.Is(err, fence.ErrOutcomeUnknown) {
			t.Errorf("Query on a %s with an argument pgx cannot encode = %v, want a known outcome", hname, err)
		}
	}
	if n, _ := counter(t, ctx, pool); n != 0 {
		t.Fatalf("counter = %d, want 0: nothing may be written", n)
	}
}
