package pgsqlsuite

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/migrations"
	"github.com/fencekit/fencekit/storage/pgsql"
)

// Bench runs the suite's benchmarks through d: each alternates a fenced
// call and its plain counterpart on the same connection and times each, so
// that both see the same machine load, and reports plain-ns/op,
// fenced-ns/op and fenced/plain:
//   - InTx: pgsql.InTx of one UPDATE under the fence that holds the mark
//     (every write of a lease after its first), beside BEGIN, UPDATE,
//     COMMIT; InTxFirst: under a new token each time (a lease's first
//     write, which raises the mark); InTxRepeatableRead: InTx beside the
//     plain transaction, both at REPEATABLE READ;
//   - TableUpdate: Table.Update of a row under the fence holding the row's
//     mark, beside one autocommit UPDATE of the row; TableUpdateFirst: under
//     a new token each time;
//   - TableUpdateSQL: the statement Table.Update sends, sent by hand
//     through database/sql, beside the plain UPDATE (what the server and
//     the wire add: two more columns written and the admission in the
//     WHERE clause); TableUpdateClient: Table.Update beside that statement
//     sent by hand (what the library adds on the client: checks, the
//     statement's text, its arguments, taking a connection for the call);
//   - Noise: that statement sent by hand beside itself, what the pairing
//     reads when there is nothing to tell apart (ideally 1.00).
//
// Each also reports plain-rows/op and fenced-rows/op, the row versions
// each side writes (inserts and updates over every table of the schema,
// from pg_stat_user_tables), counted over a hundred untimed calls of each.
// Run with -count 5 and take the medians.
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
	tbl := pgsql.Table{Name: "accounts", Key: "id"}
	token := fence.Token(0)
	next := func() fence.Fence { token++; return fence.Fence{Resource: "bench", Token: token, Holder: "h"} }
	plainTxAt := func(opts *sql.TxOptions) error {
		tx, err := db.BeginTx(ctx, opts)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, update); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	}
	plainTx := func() error { return plainTxAt(nil) }
	inTxAt := func(opts *sql.TxOptions, f fence.Fence) error {
		return pgsql.InTx(ctx, db, opts, f, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, update)
			return err
		})
	}
	inTx := func(f fence.Fence) error { return inTxAt(nil, f) }
	var n int64
	plainUpdate := func() error {
		n++
		_, err := db.ExecContext(ctx, `UPDATE accounts SET balance = $2 WHERE id = $1`, 1, n)
		return err
	}
	tableUpdate := func(f fence.Fence) error {
		n++
		return tbl.Update(ctx, db, f, 1, pgsql.Set("balance", n))
	}
	// Table.Update's statement for tbl and one Set, with its arguments in
	// its order: key, token, holder, value.
	const fencedUpdate = `UPDATE "accounts" SET "balance" = $4, "fence_token" = $2, "fence_holder" = $3 WHERE "id" = $1 AND ("fence_token" IS NULL OR "fence_token" < $2 OR ("fence_token" = $2 AND "fence_holder" = $3))`
	byHand := func(f fence.Fence) error {
		n++
		res, err := db.ExecContext(ctx, fencedUpdate, 1, int64(f.Token), f.Holder, n)
		if err != nil {
			return err
		}
		if k, err := res.RowsAffected(); err != nil || k != 1 {
			return fmt.Errorf("fenced UPDATE by hand updated %d rows (%v)", k, err)
		}
		return nil
	}
	rows := func() int64 { return rowVersions(b, ctx, db) }

	b.Run("InTx", func(b *testing.B) {
		f := next()
		Paired(b, rows, plainTx, func() error { return inTx(f) })
	})
	b.Run("InTxFirst", func(b *testing.B) {
		Paired(b, rows, plainTx, func() error { return inTx(next()) })
	})
	b.Run("InTxRepeatableRead", func(b *testing.B) {
		f, rr := next(), &sql.TxOptions{Isolation: sql.LevelRepeatableRead}
		Paired(b, rows, func() error { return plainTxAt(rr) }, func() error { return inTxAt(rr, f) })
	})
	// InTxFloor: the plain transaction with the cheapest statement a guard
	// could be added by hand, a locking read of the guard row by its key:
	// what one more statement of its kind costs on this driver, however
	// the guard is written.
	b.Run("InTxFloor", func(b *testing.B) {
		if err := inTx(next()); err != nil {
			b.Fatal(err)
		}
		Paired(b, rows, plainTx, func() error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			var tok int64
			if err := tx.QueryRowContext(ctx, `SELECT token FROM fencekit_guard WHERE resource = $1 FOR UPDATE`, "bench").Scan(&tok); err != nil {
				_ = tx.Rollback()
				return err
			}
			if _, err := tx.ExecContext(ctx, update); err != nil {
				_ = tx.Rollback()
				return err
			}
			return tx.Commit()
		})
	})
	b.Run("TableUpdate", func(b *testing.B) {
		f := next()
		Paired(b, rows, plainUpdate, func() error { return tableUpdate(f) })
	})
	b.Run("TableUpdateFirst", func(b *testing.B) {
		Paired(b, rows, plainUpdate, func() error { return tableUpdate(next()) })
	})
	b.Run("TableUpdateSQL", func(b *testing.B) {
		f := next()
		Paired(b, rows, plainUpdate, func() error { return byHand(f) })
	})
	b.Run("TableUpdateClient", func(b *testing.B) {
		f := next()
		Paired(b, rows, func() error { return byHand(f) }, func() error { return tableUpdate(f) })
	})
	b.Run("Noise", func(b *testing.B) {
		f := next()
		Paired(b, rows, func() error { return byHand(f) }, func() error { return byHand(f) })
	})
}

// Paired times plain and fenced alternately, one call each per iteration,
// and reports plain-ns/op, fenced-ns/op and fenced/plain. Before timing, it
// runs each a hundred times and reports the row versions each wrote per
// call (plain-rows/op, fenced-rows/op), as rows counts them; the fenced
// side's first call comes before its count, so that a fence that holds
// the mark from then on is counted as it is timed.
func Paired(b *testing.B, rows func() int64, plain, fenced func() error) {
	must := func(err error) {
		if err != nil {
			b.Fatal(err)
		}
	}
	must(fenced())
	perCall := func(fn func() error) float64 {
		before := rows()
		for range 100 {
			must(fn())
		}
		return float64(rows()-before) / 100
	}
	plainRows, fencedRows := perCall(plain), perCall(fenced)
	var plainTime, fencedTime time.Duration
	for b.Loop() {
		t0 := time.Now()
		must(plain())
		t1 := time.Now()
		must(fenced())
		plainTime += t1.Sub(t0)
		fencedTime += time.Since(t1)
	}
	b.ReportMetric(float64(plainTime.Nanoseconds())/float64(b.N), "plain-ns/op")
	b.ReportMetric(float64(fencedTime.Nanoseconds())/float64(b.N), "fenced-ns/op")
	b.ReportMetric(float64(fencedTime)/float64(plainTime), "fenced/plain")
	b.ReportMetric(plainRows, "plain-rows/op")
	b.ReportMetric(fencedRows, "fenced-rows/op")
}

// rowVersions returns the row versions (inserted and updated) written to
// the tables of db's schema. The statistics of the connection's own
// transactions are flushed first: db has one connection.
func rowVersions(b *testing.B, ctx context.Context, db *sql.DB) int64 {
	b.Helper()
	if _, err := db.ExecContext(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
		b.Fatal(err)
	}
	var n int64
	err := db.QueryRowContext(ctx, `SELECT coalesce(sum(n_tup_ins + n_tup_upd), 0)::bigint
FROM pg_stat_user_tables WHERE schemaname = current_schema()`).Scan(&n)
	if err != nil {
		b.Fatal(err)
	}
	return n
}
