package mysql_test

import (
	"context"
	"database/sql"
	"os"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/pgsqlsuite"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/storage/mysql"
)

// BenchmarkGuardCost alternates each fenced call with its plain
// counterpart on one connection with interpolateParams (one round trip a
// statement), as pgsqlsuite.Paired does: plain-ns/op, fenced-ns/op,
// fenced/plain, and the rows each side writes (the session's Handler_write
// and Handler_update; InnoDB does not count an UPDATE that changes
// nothing).
//   - InTx: InTx of one UPDATE under the fence that holds the mark (every
//     write of a lease after its first), beside BEGIN, UPDATE, COMMIT;
//     InTxFirst: under a new token each time (a lease's first write);
//   - TableUpdate, TableUpdateFirst: Table.Update of a row, beside one
//     autocommit UPDATE of it.
//
// The commit's log flush (innodb_flush_log_at_trx_commit) is the server's
// setting, not a session's: both sides pay it as the server has it.
// FENCEKIT_BENCH_LATENCY (such as 1ms) delays each direction through a
// proxy. Take the medians of -count 5:
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
	plainTx := func() error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		if _, err := tx.ExecContext(ctx, benchUpdate, 1); err != nil {
			return err
		}
		return tx.Commit()
	}
	inTx := func(f fence.Fence) error {
		return mysql.InTx(ctx, db, nil, f, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, benchUpdate, 1)
			return err
		})
	}
	var n int64
	plainUpdate := func() error {
		n++
		_, err := db.ExecContext(ctx, `UPDATE accounts SET balance = ? WHERE id = ?`, n, 1)
		return err
	}
	tableUpdate := func(f fence.Fence) error {
		n++
		return tbl.Update(ctx, db, f, 1, mysql.Set("balance", n))
	}
	rows := func() int64 { return sessionRowWrites(b, ctx, db) }

	b.Run("InTx", func(b *testing.B) {
		f := next()
		pgsqlsuite.Paired(b, rows, plainTx, func() error { return inTx(f) })
	})
	b.Run("InTxFirst", func(b *testing.B) {
		pgsqlsuite.Paired(b, rows, plainTx, func() error { return inTx(next()) })
	})
	b.Run("TableUpdate", func(b *testing.B) {
		f := next()
		pgsqlsuite.Paired(b, rows, plainUpdate, func() error { return tableUpdate(f) })
	})
	b.Run("TableUpdateFirst", func(b *testing.B) {
		pgsqlsuite.Paired(b, rows, plainUpdate, func() error { return tableUpdate(next()) })
	})
}

// sessionRowWrites is the session's Handler_write plus Handler_update: the
// rows db's one connection has written.
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
