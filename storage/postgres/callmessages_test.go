package postgres_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/storage/postgres"
)

// TestZeroFenceNamesTheCall: a zero fence (what a caller holds after
// ignoring an error) names the package and the call it was passed to, and
// says what to do, before anything is sent.
func TestZeroFenceNamesTheCall(t *testing.T) {
	ctx, pool := setup(t)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	tbl := postgres.Table{Name: pgx.Identifier{"counter"}, Key: "id"}
	noop := func(context.Context, pgx.Tx) error { return nil }
	var zero fence.Fence
	for call, err := range map[string]error{
		"Exec":         func() error { _, err := postgres.Exec(ctx, pool, zero); return err }(),
		"Query":        postgres.Query(ctx, pool, zero, postgres.Statement{SQL: "SELECT 1"}, func(pgx.Rows) error { return nil }),
		"InTx":         postgres.InTx(ctx, pool, pgx.TxOptions{}, zero, noop),
		"Guard":        postgres.Guard(ctx, tx, zero),
		"GuardAll":     postgres.GuardAll(ctx, tx, zero),
		"Table.Update": tbl.Update(ctx, pool, zero, 1),
		"Table.Upsert": tbl.Upsert(ctx, pool, zero, 1),
		"Once":         func() error { _, err := postgres.Once(ctx, pool, zero, "k", noop); return err }(),
	} {
		want := "postgres: " + call + ": invalid fence: zero Fence: was an error from Acquire or FenceLock ignored?; check the error of the call that gave you the fence, and pass the fence of a lock you hold"
		if err == nil || err.Error() != want || !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("%s: err = %v\nwant %s", call, err, want)
		}
	}
	// The transaction was left alone.
	if err := postgres.Guard(ctx, tx, fenceOf("r", 1, "h")); err != nil {
		t.Fatalf("Guard after the refused zero fences: %v", err)
	}
}

// TestUpdateVersionWithoutVersionColumn: UpdateVersion on a table without
// its version column gives the ALTER TABLE that adds it, and still wraps
// the server's error.
func TestUpdateVersionWithoutVersionColumn(t *testing.T) {
	ctx, pool := setup(t)
	mustExec(t, ctx, pool, `CREATE TABLE unversioned (id int PRIMARY KEY, state text)`)
	mustExec(t, ctx, pool, `INSERT INTO unversioned VALUES (1, 'new')`)
	tbl := postgres.Table{Name: pgx.Identifier{"unversioned"}, Key: "id"}
	_, err := tbl.UpdateVersion(ctx, pool, 1, 1, postgres.Set("state", "done"))
	const want = `postgres: versioned update of "unversioned": table "unversioned" lacks the version column "version"; add it with ALTER TABLE "unversioned" ADD COLUMN IF NOT EXISTS "version" bigint NOT NULL DEFAULT 1, or name the table's own in Table.Version: ERROR: column "version" does not exist (SQLSTATE 42703)`
	var pgErr *pgconn.PgError
	if err == nil || err.Error() != want || !errors.As(err, &pgErr) || errors.Is(err, fence.ErrOutcomeUnknown) {
		t.Fatalf("UpdateVersion = %v\nwant %s", err, want)
	}
	mustExec(t, ctx, pool, `ALTER TABLE "unversioned" ADD COLUMN IF NOT EXISTS "version" bigint NOT NULL DEFAULT 1`)
	if next, err := tbl.UpdateVersion(ctx, pool, 1, 1, postgres.Set("state", "done")); err != nil || next != 2 {
		t.Fatalf("UpdateVersion after the ALTER TABLE given = %d, %v", next, err)
	}
	// A missing column of the caller's gets no hint.
	_, err = tbl.UpdateVersion(ctx, pool, 1, 2, postgres.Set("nope", "x"))
	if err == nil || strings.Contains(err.Error(), "ALTER TABLE") {
		t.Fatalf("caller's missing column: %v", err)
	}
}
