package postgres_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/storage/postgres"
)

const benchUpdate = `UPDATE counter SET n = n + 1 WHERE id = $1`

// BenchmarkFencedExec is the one-round-trip fenced write: guard and UPDATE
// pipelined in one implicit transaction.
func BenchmarkFencedExec(b *testing.B) {
	ctx, pool := setup(b)
	f := fenceOf("counter", 1, "h")
	stmt := postgres.Statement{SQL: benchUpdate, Args: []any{1}}
	if _, err := postgres.Exec(ctx, pool, f, stmt); err != nil { // warm the statement cache
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := postgres.Exec(ctx, pool, f, stmt); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPlainUpdate is the reference: the same UPDATE in autocommit, no
// fencing, on the same kind of pool.
func BenchmarkPlainUpdate(b *testing.B) {
	ctx, pool := setup(b)
	if _, err := pool.Exec(ctx, benchUpdate, 1); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := pool.Exec(ctx, benchUpdate, 1); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkInTx is the interactive fenced transaction: BEGIN, guard, UPDATE
// and COMMIT, one round trip each.
func BenchmarkInTx(b *testing.B) {
	ctx, pool := setup(b)
	f := fenceOf("counter", 1, "h")
	fn := func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, benchUpdate, 1)
		return err
	}
	if err := postgres.InTx(ctx, pool, pgx.TxOptions{}, f, fn); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := postgres.InTx(ctx, pool, pgx.TxOptions{}, f, fn); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFencedQuery is the one-round-trip fenced read: guard and SELECT
// pipelined in one implicit transaction.
func BenchmarkFencedQuery(b *testing.B) {
	ctx, pool := setup(b)
	f := fenceOf("counter", 1, "h")
	stmt := postgres.Statement{SQL: `SELECT n FROM counter WHERE id = $1`, Args: []any{1}}
	var n int64
	scan := func(rows pgx.Rows) error {
		for rows.Next() {
			if err := rows.Scan(&n); err != nil {
				return err
			}
		}
		return rows.Err()
	}
	if err := postgres.Query(ctx, pool, f, stmt, scan); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := postgres.Query(ctx, pool, f, stmt, scan); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPlainQuery is the reference for BenchmarkFencedQuery: the same
// SELECT, unfenced.
func BenchmarkPlainQuery(b *testing.B) {
	ctx, pool := setup(b)
	var n int64
	b.ReportAllocs()
	for b.Loop() {
		if err := pool.QueryRow(ctx, `SELECT n FROM counter WHERE id = $1`, 1).Scan(&n); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkOnce runs new work each time: BenchmarkInTx plus the completion
// record, one more round trip (the record's INSERT) and one more row and
// index entry per key.
func BenchmarkOnce(b *testing.B) {
	ctx, pool := setup(b)
	f := fenceOf("counter", 1, "h")
	fn := func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, benchUpdate, 1)
		return err
	}
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		i++
		if ran, err := postgres.Once(ctx, pool, f, "k"+strconv.Itoa(i), fn); err != nil || !ran {
			b.Fatal(ran, err)
		}
	}
}

// BenchmarkOnceDone is the call that finds its key done: BEGIN, guard, the
// record's INSERT finding the key, COMMIT; fn does not run.
func BenchmarkOnceDone(b *testing.B) {
	ctx, pool := setup(b)
	f := fenceOf("counter", 1, "h")
	fn := func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, benchUpdate, 1)
		return err
	}
	if _, err := postgres.Once(ctx, pool, f, "k", fn); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if ran, err := postgres.Once(ctx, pool, f, "k", fn); err != nil || ran {
			b.Fatal(ran, err)
		}
	}
}

// BenchmarkTableUpdate is Table.Update of one row under the fence that
// holds its mark; BenchmarkTableUpdateByHand sends the statement
// Table.Update sends with pgx alone. Their allocs/op and B/op differ by
// what the library adds on the client (checks, span, arguments); the
// paired figures are BenchmarkGuardCost's.
func BenchmarkTableUpdate(b *testing.B) {
	ctx, pool, tbl := setupAccounts(b)
	f := fenceOf("bench", 5, "h")
	var n int64
	b.ReportAllocs()
	for b.Loop() {
		n++
		if err := tbl.Update(ctx, pool, f, 1, postgres.Set("balance", n)); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkTableUpdateByHand(b *testing.B) {
	ctx, pool, _ := setupAccounts(b)
	const fencedUpdate = `UPDATE "accounts" SET "balance" = $4, "fence_token" = $2, "fence_holder" = $3 WHERE "id" = $1 AND ("fence_token" IS NULL OR "fence_token" < $2 OR ("fence_token" = $2 AND "fence_holder" = $3))`
	var n int64
	b.ReportAllocs()
	for b.Loop() {
		n++
		if _, err := pool.Exec(ctx, fencedUpdate, 1, int64(5), "h", n); err != nil {
			b.Fatal(err)
		}
	}
}

func setupAccounts(b *testing.B) (context.Context, *pgxpool.Pool, postgres.Table) {
	ctx, pool := setup(b)
	mustExec(b, ctx, pool, `CREATE TABLE accounts (id bigint PRIMARY KEY, balance bigint NOT NULL, fence_token bigint, fence_holder text)`)
	mustExec(b, ctx, pool, `INSERT INTO accounts (id, balance) VALUES (1, 0)`)
	return ctx, pool, postgres.Table{Name: pgx.Identifier{"accounts"}, Key: "id"}
}
