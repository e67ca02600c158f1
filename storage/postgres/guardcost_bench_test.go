package postgres_test

import (
	"context"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/migrations"
	"github.com/fencekit/fencekit/storage/postgres"
)

// BenchmarkGuardCost sets each fenced call beside its plain counterpart,
// on one connection whose session runs with synchronous_commit off (so
// that the commit's flush, the same on both sides, does not hide the
// guard):
//   - PlainTx: BEGIN, UPDATE, COMMIT; InTx: the same through InTx under
//     the fence that holds the mark (every write of a lease after its
//     first); InTxFirst: under a new token each time (a lease's first
//     write, which raises the mark);
//   - PlainUpdate: one autocommit UPDATE of a row; TableUpdate and
//     TableUpdateFirst: the same row through Table.Update.
//
// Each reports rows/op and guard-rows/op, the row versions written (all
// tables, and the guard table), from pg_stat_user_tables. Run with
// -count 5 for interleaved runs; FENCEKIT_BENCH_LATENCY (such as 1ms)
// delays each direction through a proxy.
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
	fn := func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, update)
		return err
	}
	inTx := func(f fence.Fence) {
		if err := postgres.InTx(ctx, pool, pgx.TxOptions{}, f, fn); err != nil {
			b.Fatal(err)
		}
	}
	var n int64
	tableUpdate := func(f fence.Fence) {
		n++
		if err := tbl.Update(ctx, pool, f, 1, postgres.Set("balance", n)); err != nil {
			b.Fatal(err)
		}
	}

	b.Run("PlainTx", func(b *testing.B) {
		defer countRowVersions(b, ctx, pool)()
		for b.Loop() {
			tx, err := pool.Begin(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := tx.Exec(ctx, update); err != nil {
				b.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("InTx", func(b *testing.B) {
		f := next()
		inTx(f) // the lease's first write, untimed
		defer countRowVersions(b, ctx, pool)()
		for b.Loop() {
			inTx(f)
		}
	})
	b.Run("InTxFirst", func(b *testing.B) {
		defer countRowVersions(b, ctx, pool)()
		for b.Loop() {
			inTx(next())
		}
	})
	b.Run("PlainUpdate", func(b *testing.B) {
		defer countRowVersions(b, ctx, pool)()
		for b.Loop() {
			n++
			if _, err := pool.Exec(ctx, `UPDATE accounts SET balance = $2 WHERE id = $1`, 1, n); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("TableUpdate", func(b *testing.B) {
		f := next()
		tableUpdate(f)
		defer countRowVersions(b, ctx, pool)()
		for b.Loop() {
			tableUpdate(f)
		}
	})
	b.Run("TableUpdateFirst", func(b *testing.B) {
		defer countRowVersions(b, ctx, pool)()
		for b.Loop() {
			tableUpdate(next())
		}
	})
}

// countRowVersions reads the row versions written so far in the schema of
// pool (one connection) and returns a function that reports, per iteration
// of b, how many more were written: rows/op over every table,
// guard-rows/op in the guard table.
func countRowVersions(b *testing.B, ctx context.Context, pool *pgxpool.Pool) func() {
	all, guard := schemaRowVersions(b, ctx, pool)
	return func() {
		all2, guard2 := schemaRowVersions(b, ctx, pool)
		b.ReportMetric(float64(all2-all)/float64(b.N), "rows/op")
		b.ReportMetric(float64(guard2-guard)/float64(b.N), "guard-rows/op")
	}
}

// schemaRowVersions returns the row versions (inserted and updated) written
// to the tables of pool's schema, and to its guard table, once the
// statistics of the connection's own transactions are flushed.
func schemaRowVersions(b *testing.B, ctx context.Context, pool *pgxpool.Pool) (all, guard int64) {
	b.Helper()
	if _, err := pool.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
		b.Fatal(err)
	}
	err := pool.QueryRow(ctx, `SELECT coalesce(sum(n_tup_ins + n_tup_upd), 0)::bigint,
	coalesce(sum(n_tup_ins + n_tup_upd) FILTER (WHERE relname = 'fencekit_guard'), 0)::bigint
FROM pg_stat_user_tables WHERE schemaname = current_schema()`).Scan(&all, &guard)
	if err != nil {
		b.Fatal(err)
	}
	return all, guard
}
