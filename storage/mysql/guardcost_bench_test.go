package mysql_test

import (
	"context"
	"database/sql"
	"os"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/storage/mysql"
)

// BenchmarkGuardCost sets each fenced call beside its plain counterpart,
// on one connection with interpolateParams (one round trip a statement):
//   - PlainTx: BEGIN, UPDATE, COMMIT; InTx: the same through InTx under
//     the fence that holds the mark (every write of a lease after its
//     first); InTxFirst: under a new token each time (a lease's first
//     write, which raises the mark);
//   - PlainUpdate: one autocommit UPDATE of a row; TableUpdate and
//     TableUpdateFirst: the same row through Table.Update.
//
// Each reports rows/op, the rows its calls wrote (the session's
// Handler_write and Handler_update: InnoDB does not count an UPDATE that
// changes nothing). Run with -count 5 for interleaved runs;
// FENCEKIT_BENCH_LATENCY (such as 1ms) delays each direction through a
// proxy. The commit's log flush (innodb_flush_log_at_trx_commit) is a
// server setting, not a session's: it stays as the server has it.
//
//	go test -run '^$' -bench GuardCost -count 5 ./storage/mysql/
func BenchmarkGuardCost(b *testing.B) {
	cfg := testenv.MySQLConfig(b)
	cfg.InterpolateParams = true
	if v := os.Getenv("FENCEKIT_BENCH_LATENCY"); v != "" {
		lat, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("FENCEKIT_BENCH_LATENCY=%q: %v", v, err)
		}
		p := testenv.StartProxy(b, cfg.Addr)
		p.SetLatency(lat)
		cfg.Addr = p.Addr()
	}
	ctx, db := setupWith(b, cfg)
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	mustExec(b, ctx, db, `CREATE TABLE accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL, fence_token BIGINT, fence_holder VARBINARY(1024))`)
	mustExec(b, ctx, db, `INSERT INTO accounts (id, balance) VALUES (1, 0)`)
	tbl := mysql.Table{Name: "accounts", Key: "id"}
	token := fence.Token(0)
	next := func() fence.Fence { token++; return fence.Fence{Resource: "bench", Token: token, Holder: "h"} }
	fn := func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, benchUpdate, 1)
		return err
	}
	inTx := func(f fence.Fence) {
		if err := mysql.InTx(ctx, db, nil, f, fn); err != nil {
			b.Fatal(err)
		}
	}
	var n int64
	tableUpdate := func(f fence.Fence) {
		n++
		if err := tbl.Update(ctx, db, f, 1, mysql.Set("balance", n)); err != nil {
			b.Fatal(err)
		}
	}

	b.Run("PlainTx", func(b *testing.B) {
		defer countRowWrites(b, ctx, db)()
		for b.Loop() {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := tx.ExecContext(ctx, benchUpdate, 1); err != nil {
				b.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("InTx", func(b *testing.B) {
		f := next()
		inTx(f) // the lease's first write, untimed
		defer countRowWrites(b, ctx, db)()
		for b.Loop() {
			inTx(f)
		}
	})
	b.Run("InTxFirst", func(b *testing.B) {
		inTx(next()) // the guard row exists from here on
		defer countRowWrites(b, ctx, db)()
		for b.Loop() {
			inTx(next())
		}
	})
	b.Run("PlainUpdate", func(b *testing.B) {
		defer countRowWrites(b, ctx, db)()
		for b.Loop() {
			n++
			if _, err := db.ExecContext(ctx, `UPDATE accounts SET balance = ? WHERE id = ?`, n, 1); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("TableUpdate", func(b *testing.B) {
		f := next()
		tableUpdate(f)
		defer countRowWrites(b, ctx, db)()
		for b.Loop() {
			tableUpdate(f)
		}
	})
	b.Run("TableUpdateFirst", func(b *testing.B) {
		defer countRowWrites(b, ctx, db)()
		for b.Loop() {
			tableUpdate(next())
		}
	})
}

// countRowWrites reads the rows db's one connection has written so far
// and returns a function that reports, per iteration of b, how many more
// it wrote (rows/op).
func countRowWrites(b *testing.B, ctx context.Context, db *sql.DB) func() {
	before := sessionRowWrites(b, ctx, db)
	return func() {
		b.ReportMetric(float64(sessionRowWrites(b, ctx, db)-before)/float64(b.N), "rows/op")
	}
}

// sessionRowWrites is the session's Handler_write plus Handler_update.
func sessionRowWrites(b *testing.B, ctx context.Context, db *sql.DB) int64 {
	b.Helper()
	var n int64
	err := db.QueryRowContext(ctx, `SELECT SUM(VARIABLE_VALUE) FROM information_schema.SESSION_STATUS
WHERE VARIABLE_NAME IN ('HANDLER_WRITE', 'HANDLER_UPDATE')`).Scan(&n)
	if err != nil {
		b.Fatal(err)
	}
	return n
}
