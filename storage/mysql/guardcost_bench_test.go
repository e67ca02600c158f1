package mysql_test

import (
	"context"
	"database/sql"
	"fmt"
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
//     autocommit UPDATE of it;
//   - TableUpdateSQL: the statement Table.Update sends, sent by hand,
//     beside the plain UPDATE (what the server and the wire add: two more
//     columns written, the admission and the sql_mode check in the WHERE
//     clause); TableUpdateClient: Table.Update beside that statement sent
//     by hand (what the library adds on the client: checks, the
//     statement's text, its arguments, taking a connection for the call);
//   - Noise: that statement sent by hand beside itself, what the pairing
//     reads when there is nothing to tell apart (ideally 1.00).
//
// The commit's log flush (innodb_flush_log_at_trx_commit) is the server's
// setting, not a session's: both sides pay it as the server has it. To
// see the guard without the flush, point FENCEKIT_TEST_MYSQL at a server
// started with innodb_flush_log_at_trx_commit=2 (docs/performance.md).
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
	// Table.Update's statement for tbl and one Set, with its arguments in
	// its order: value, token, holder, key, token, token, holder.
	const fencedUpdate = "UPDATE `accounts` SET `balance` = ?, `fence_token` = ?, `fence_holder` = ? WHERE `id` = ? AND " +
		"(`fence_token` IS NULL OR `fence_token` < ? OR (`fence_token` = ? AND `fence_holder` = ?)) AND " +
		"(FIND_IN_SET('STRICT_TRANS_TABLES', @@SESSION.sql_mode) > 0 OR FIND_IN_SET('STRICT_ALL_TABLES', @@SESSION.sql_mode) > 0)"
	byHand := func(f fence.Fence) error {
		n++
		tok := int64(f.Token)
		res, err := db.ExecContext(ctx, fencedUpdate, n, tok, f.Holder, 1, tok, tok, f.Holder)
		if err != nil {
			return err
		}
		if k, err := res.RowsAffected(); err != nil || k != 1 {
			return fmt.Errorf("fenced UPDATE by hand updated %d rows (%v)", k, err)
		}
		return nil
	}
	rows := func() int64 { return sessionRowWrites(b, ctx, db) }

	paired := func(b *testing.B, plain, fenced func() error) {
		pgsqlsuite.Paired(b, rows, plain, fenced)
		reportOps(b, ctx, db, plain, fenced)
	}
	b.Run("InTx", func(b *testing.B) {
		f := next()
		paired(b, plainTx, func() error { return inTx(f) })
	})
	b.Run("InTxFirst", func(b *testing.B) {
		paired(b, plainTx, func() error { return inTx(next()) })
	})
	// InTxFloor: the plain transaction with the cheapest statement a guard
	// could be added by hand, a locking read of the guard row by its key:
	// what one more statement of its kind costs, however the guard is
	// written.
	b.Run("InTxFloor", func(b *testing.B) {
		if err := inTx(next()); err != nil {
			b.Fatal(err)
		}
		paired(b, plainTx, func() error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback() }()
			var tok int64
			if err := tx.QueryRowContext(ctx, `SELECT token FROM fencekit_guard WHERE resource = ? FOR UPDATE`, "bench").Scan(&tok); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, benchUpdate, 1); err != nil {
				return err
			}
			return tx.Commit()
		})
	})
	// InTxNoDeadline: InTx and the plain transaction under a context that
	// cannot end. The other InTx runs' context has a deadline: go-sql-driver
	// then hands each statement's context to a watcher goroutine, on both
	// sides, and since its COMMIT does not watch the context, InTx hands
	// the COMMIT to a goroutine of its own so as to return when the context
	// ends. With nothing to end it, InTx commits in the caller's goroutine.
	b.Run("InTxNoDeadline", func(b *testing.B) {
		f := next()
		bg := context.Background()
		paired(b, func() error {
			tx, err := db.BeginTx(bg, nil)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback() }()
			if _, err := tx.ExecContext(bg, benchUpdate, 1); err != nil {
				return err
			}
			return tx.Commit()
		}, func() error {
			return mysql.InTx(bg, db, nil, f, func(ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, benchUpdate, 1)
				return err
			})
		})
	})
	b.Run("TableUpdate", func(b *testing.B) {
		f := next()
		paired(b, plainUpdate, func() error { return tableUpdate(f) })
	})
	b.Run("TableUpdateFirst", func(b *testing.B) {
		paired(b, plainUpdate, func() error { return tableUpdate(next()) })
	})
	b.Run("TableUpdateSQL", func(b *testing.B) {
		f := next()
		paired(b, plainUpdate, func() error { return byHand(f) })
	})
	b.Run("TableUpdateClient", func(b *testing.B) {
		f := next()
		paired(b, func() error { return byHand(f) }, func() error { return tableUpdate(f) })
	})
	b.Run("Noise", func(b *testing.B) {
		f := next()
		paired(b, func() error { return byHand(f) }, func() error { return byHand(f) })
	})
}

// reportOps runs plain and fenced a hundred times each and reports, per
// call, the statements each sends (plain-stmts/op, fenced-stmts/op: the
// session's Com_ counters of BEGIN, COMMIT, ROLLBACK and the statements
// that read or write rows) and the rows InnoDB is asked to read by key
// (plain-reads/op, fenced-reads/op: Handler_read_key, which counts the
// row an UPDATE or a locking read looks up).
func reportOps(b *testing.B, ctx context.Context, db *sql.DB, plain, fenced func() error) {
	b.Helper()
	perCall := func(fn func() error) (stmts, reads float64) {
		before := sessionOps(b, ctx, db)
		for range 100 {
			if err := fn(); err != nil {
				b.Fatal(err)
			}
		}
		after := sessionOps(b, ctx, db)
		// Each read of the counters is a statement too.
		return float64(after[0]-before[0]-1) / 100, float64(after[1]-before[1]) / 100
	}
	ps, pr := perCall(plain)
	fs, fr := perCall(fenced)
	b.ReportMetric(ps, "plain-stmts/op")
	b.ReportMetric(fs, "fenced-stmts/op")
	b.ReportMetric(pr, "plain-reads/op")
	b.ReportMetric(fr, "fenced-reads/op")
}

// sessionOps is the session's statements (as reportOps counts them) and
// Handler_read_key.
func sessionOps(b *testing.B, ctx context.Context, db *sql.DB) [2]int64 {
	b.Helper()
	var n [2]int64
	err := db.QueryRowContext(ctx, `SELECT
    SUM(IF(VARIABLE_NAME IN ('COM_SELECT', 'COM_UPDATE', 'COM_INSERT', 'COM_BEGIN', 'COM_COMMIT', 'COM_ROLLBACK'), VARIABLE_VALUE, 0)),
    SUM(IF(VARIABLE_NAME = 'HANDLER_READ_KEY', VARIABLE_VALUE, 0))
FROM information_schema.SESSION_STATUS`).Scan(&n[0], &n[1])
	if err != nil {
		b.Fatal(err)
	}
	return n
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
