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
//     with the guard as one more statement;
//   - PlainUpdate: one autocommit UPDATE of a row; TableUpdate: the same
//     row's fenced update through Table.Update, one statement too.
//
// Compare them with benchstat or by their ns/op. The session runs with
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

	b.Run("PlainTx", func(b *testing.B) {
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
		for b.Loop() {
			err := pgsql.InTx(ctx, db, nil, f, func(ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, update)
				return err
			})
			if err != nil {
				b.Fatal(err)
			}
		}
	})
	var n int64
	b.Run("PlainUpdate", func(b *testing.B) {
		for b.Loop() {
			n++
			if _, err := db.ExecContext(ctx, `UPDATE accounts SET balance = $2 WHERE id = $1`, 1, n); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("TableUpdate", func(b *testing.B) {
		for b.Loop() {
			n++
			if err := tbl.Update(ctx, db, f, 1, pgsql.Set("balance", n)); err != nil {
				b.Fatal(err)
			}
		}
	})
}
