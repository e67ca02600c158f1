package pgsqlsuite

import (
	"context"
	"database/sql"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/migrations"
	"github.com/fencekit/fencekit/storage/pgsql"
)

// Bench runs the suite's benchmarks through d, each against its plain
// counterpart on the same connection:
//   - PlainTx: BEGIN, UPDATE, COMMIT; InTx: the same through pgsql.InTx,
//     with the guard as one more statement, under the fence that holds the
//     mark (every write of a lease after its first); InTxFirst: under a new
//     token each time (the first write of a lease, which raises the mark);
//   - PlainUpdate: one autocommit UPDATE of a row; TableUpdate: the same
//     row's fenced update through Table.Update, one statement too, under
//     the fence holding the row's mark; TableUpdateFirst: under a new token
//     each time.
//
// Each reports rows/op, the row versions its transactions wrote (inserts
// and updates, from pg_stat_user_tables, over every table of the schema),
// and guard-rows/op, those of the guard table. Run with -count 5: the
// sub-benchmarks then run interleaved, and each one's median compares with
// its plain counterpart's. The session runs with
// synchronous_commit off, so that a COMMIT does not wait for the disk and
// the figures count round trips and server work; with commits that wait
// for an fsync, the guard's share is smaller.
//
// FENCEKIT_BENCH_LATENCY (a Go duration, such as 1ms) sends every
// connection through a proxy that delays each chunk of bytes by that much
// each way: round trips then dominate, and the ratios count them, which a
// loaded machine's loopback figures cannot do reliably.
func Bench(b *testing.B, d Driver) {
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
	db, err := d.Open(u)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	if err := migrations.Up(ctx, db); err != nil {
		b.Fatal(err)
	}
	for _, q := range []string{
		`CREATE TABLE counter (id int PRIMARY KEY, n bigint NOT NULL)`,
		`INSERT INTO counter (id, n) VALUES (1, 0)`,
		`CREATE TABLE accounts (id bigint PRIMARY KEY, balance bigint NOT NULL, fence_token bigint, fence_holder text)`,
		`INSERT INTO accounts (id, balance) VALUES (1, 0)`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
	const update = `UPDATE counter SET n = n + 1 WHERE id = 1`
	f := fence.Fence{Resource: "bench", Token: 1, Holder: "h"}
	tbl := pgsql.Table{Name: "accounts", Key: "id"}
	// first is a token above every one used so far: a new lease's.
	first := fence.Token(1)
	next := func() fence.Fence { first++; return fence.Fence{Resource: "bench", Token: first, Holder: "h"} }
	inTx := func(f fence.Fence) {
		err := pgsql.InTx(ctx, db, nil, f, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, update)
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
	}

	b.Run("PlainTx", func(b *testing.B) {
		defer countRows(b, ctx, db)()
		for b.Loop() {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := tx.ExecContext(ctx, update); err != nil {
				b.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("InTx", func(b *testing.B) {
		f = next()
		inTx(f) // the lease's first write, untimed
		defer countRows(b, ctx, db)()
		for b.Loop() {
			inTx(f)
		}
	})
	b.Run("InTxFirst", func(b *testing.B) {
		defer countRows(b, ctx, db)()
		for b.Loop() {
			inTx(next())
		}
	})
	var n int64
	b.Run("PlainUpdate", func(b *testing.B) {
		defer countRows(b, ctx, db)()
		for b.Loop() {
			n++
			if _, err := db.ExecContext(ctx, `UPDATE accounts SET balance = $2 WHERE id = $1`, 1, n); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("TableUpdate", func(b *testing.B) {
		f = next()
		if err := tbl.Update(ctx, db, f, 1, pgsql.Set("balance", n)); err != nil {
			b.Fatal(err)
		}
		defer countRows(b, ctx, db)()
		for b.Loop() {
			n++
			if err := tbl.Update(ctx, db, f, 1, pgsql.Set("balance", n)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("TableUpdateFirst", func(b *testing.B) {
		defer countRows(b, ctx, db)()
		for b.Loop() {
			n++
			if err := tbl.Update(ctx, db, next(), 1, pgsql.Set("balance", n)); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// countRows reads the row versions written so far in the schema of db (one
// connection) and returns a function that reports, per iteration of b, how
// many more were written: rows/op over every table, guard-rows/op in the
// guard table.
func countRows(b *testing.B, ctx context.Context, db *sql.DB) func() {
	all, guard := rowVersions(b, ctx, db)
	return func() {
		all2, guard2 := rowVersions(b, ctx, db)
		b.ReportMetric(float64(all2-all)/float64(b.N), "rows/op")
		b.ReportMetric(float64(guard2-guard)/float64(b.N), "guard-rows/op")
	}
}

// rowVersions returns the row versions (inserted and updated) written to
// the tables of db's schema, and to its guard table. The statistics of the
// connection's own transactions are flushed first: db has one connection.
func rowVersions(b *testing.B, ctx context.Context, db *sql.DB) (all, guard int64) {
	b.Helper()
	if _, err := db.ExecContext(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
		b.Fatal(err)
	}
	err := db.QueryRowContext(ctx, `SELECT coalesce(sum(n_tup_ins + n_tup_upd), 0)::bigint,
	coalesce(sum(n_tup_ins + n_tup_upd) FILTER (WHERE relname = 'fencekit_guard'), 0)::bigint
FROM pg_stat_user_tables WHERE schemaname = current_schema()`).Scan(&all, &guard)
	if err != nil {
		b.Fatal(err)
	}
	return all, guard
}
