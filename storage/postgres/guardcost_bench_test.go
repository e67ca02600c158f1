package postgres_test

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/pgsqlsuite"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/migrations"
	"github.com/fencekit/fencekit/storage/postgres"
)

// BenchmarkGuardCost alternates each fenced call with its plain
// counterpart on one connection (pgsqlsuite.Paired: plain-ns/op,
// fenced-ns/op, fenced/plain, and the row versions each side writes, from
// pg_stat_user_tables). The session runs with synchronous_commit off, so
// that the commit's flush, the same on both sides, does not hide the guard.
//   - InTx: InTx of one UPDATE under the fence that holds the mark (every
//     write of a lease after its first), beside BEGIN, UPDATE, COMMIT;
//     InTxFirst: under a new token each time (a lease's first write);
//     InTxRepeatableRead: InTx beside the plain transaction, both at
//     REPEATABLE READ;
//   - TableUpdate, TableUpdateFirst: Table.Update of a row, beside one
//     autocommit UPDATE of it;
//   - TableUpdateSQL: the statement Table.Update sends, sent by hand,
//     beside the plain UPDATE (what the server and the wire add: two more
//     columns written and the admission in the WHERE clause);
//     TableUpdateClient: Table.Update beside that statement sent by hand
//     (what the library adds on the client: checks, the statement's text,
//     its span, taking a connection for the call);
//   - Noise: that statement sent by hand beside itself, what the pairing
//     reads when there is nothing to tell apart (ideally 1.00).
//
// FENCEKIT_BENCH_LATENCY (such as 1ms) delays each direction through a
// proxy. Take the medians of -count 5:
//
//	go test -run '^$' -bench GuardCost -count 5 ./storage/postgres/
func BenchmarkGuardCost(b *testing.B) {
	ctx := context.Background()
	u := testenv.PostgresURL(b) + "&synchronous_commit=off"
	if v := os.Getenv("FENCEKIT_BENCH_LATENCY"); v != "" {
		lat, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("FENCEKIT_BENCH_LATENCY=%q: %v", v, err)
		}
		pu, err := url.Parse(u)
		if err != nil {
			b.Fatal(err)
		}
		p := testenv.StartProxy(b, pu.Host)
		p.SetLatency(lat)
		pu.Host = p.Addr()
		u = pu.String()
	}
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	db := stdlib.OpenDBFromPool(pool)
	if err := migrations.Up(ctx, db); err != nil {
		b.Fatal(err)
	}
	_ = db.Close()
	for _, q := range []string{
		`CREATE TABLE counter (id int PRIMARY KEY, n bigint NOT NULL)`,
		`INSERT INTO counter (id, n) VALUES (1, 0)`,
		`CREATE TABLE accounts (id bigint PRIMARY KEY, balance bigint NOT NULL, fence_token bigint, fence_holder text)`,
		`INSERT INTO accounts (id, balance) VALUES (1, 0)`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
	const update = `UPDATE counter SET n = n + 1 WHERE id = 1`
	tbl := postgres.Table{Name: pgx.Identifier{"accounts"}, Key: "id"}
	token := fence.Token(0)
	next := func() fence.Fence { token++; return fence.Fence{Resource: "bench", Token: token, Holder: "h"} }
	plainTxAt := func(opts pgx.TxOptions) error {
		tx, err := pool.BeginTx(ctx, opts)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, update); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	plainTx := func() error { return plainTxAt(pgx.TxOptions{}) }
	inTxAt := func(opts pgx.TxOptions, f fence.Fence) error {
		return postgres.InTx(ctx, pool, opts, f, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, update)
			return err
		})
	}
	inTx := func(f fence.Fence) error { return inTxAt(pgx.TxOptions{}, f) }
	var n int64
	plainUpdate := func() error {
		n++
		_, err := pool.Exec(ctx, `UPDATE accounts SET balance = $2 WHERE id = $1`, 1, n)
		return err
	}
	tableUpdate := func(f fence.Fence) error {
		n++
		return tbl.Update(ctx, pool, f, 1, postgres.Set("balance", n))
	}
	// Table.Update's statement for tbl and one Set, with its arguments in
	// its order: key, token, holder, value.
	const fencedUpdate = `UPDATE "accounts" SET "balance" = $4, "fence_token" = $2, "fence_holder" = $3 WHERE "id" = $1 AND ("fence_token" IS NULL OR "fence_token" < $2 OR ("fence_token" = $2 AND "fence_holder" = $3))`
	byHand := func(f fence.Fence) error {
		n++
		tag, err := pool.Exec(ctx, fencedUpdate, 1, int64(f.Token), f.Holder, n)
		if err == nil && tag.RowsAffected() != 1 {
			err = fmt.Errorf("fenced UPDATE by hand updated %d rows", tag.RowsAffected())
		}
		return err
	}
	rows := func() int64 { return schemaRowVersions(b, ctx, pool) }

	b.Run("InTx", func(b *testing.B) {
		f := next()
		pgsqlsuite.Paired(b, rows, plainTx, func() error { return inTx(f) })
	})
	b.Run("InTxFirst", func(b *testing.B) {
		pgsqlsuite.Paired(b, rows, plainTx, func() error { return inTx(next()) })
	})
	b.Run("InTxRepeatableRead", func(b *testing.B) {
		f, rr := next(), pgx.TxOptions{IsoLevel: pgx.RepeatableRead}
		pgsqlsuite.Paired(b, rows, func() error { return plainTxAt(rr) }, func() error { return inTxAt(rr, f) })
	})
	b.Run("TableUpdate", func(b *testing.B) {
		f := next()
		pgsqlsuite.Paired(b, rows, plainUpdate, func() error { return tableUpdate(f) })
	})
	b.Run("TableUpdateFirst", func(b *testing.B) {
		pgsqlsuite.Paired(b, rows, plainUpdate, func() error { return tableUpdate(next()) })
	})
	b.Run("TableUpdateSQL", func(b *testing.B) {
		f := next()
		pgsqlsuite.Paired(b, rows, plainUpdate, func() error { return byHand(f) })
	})
	b.Run("TableUpdateClient", func(b *testing.B) {
		f := next()
		pgsqlsuite.Paired(b, rows, func() error { return byHand(f) }, func() error { return tableUpdate(f) })
	})
	b.Run("Noise", func(b *testing.B) {
		f := next()
		pgsqlsuite.Paired(b, rows, func() error { return byHand(f) }, func() error { return byHand(f) })
	})
}

// schemaRowVersions returns the row versions (inserted and updated) written
// to the tables of pool's schema, once the statistics of the connection's
// own transactions are flushed (pool has one connection).
func schemaRowVersions(b *testing.B, ctx context.Context, pool *pgxpool.Pool) int64 {
	b.Helper()
	if _, err := pool.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
		b.Fatal(err)
	}
	var n int64
	err := pool.QueryRow(ctx, `SELECT coalesce(sum(n_tup_ins + n_tup_upd), 0)::bigint
FROM pg_stat_user_tables WHERE schemaname = current_schema()`).Scan(&n)
	if err != nil {
		b.Fatal(err)
	}
	return n
}
