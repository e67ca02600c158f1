package mysql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/storage/mysql"
)

// withdraw is fn for a fenced withdrawal of 100 from a balance kept as a
// ledger (the sum of its rows): it reads the balance into *read and inserts
// -100 only when the balance covers it. Inserts never update a row the
// older holder wrote, so only the guard can tell a newer holder that its
// snapshot is too old.
func withdraw(read *int64) mysql.TxFunc {
	return func(ctx context.Context, tx *sql.Tx) error {
		var bal int64
		if err := tx.QueryRowContext(ctx, `SELECT SUM(amount) FROM ledger`).Scan(&bal); err != nil {
			return err
		}
		*read = bal
		if bal < 100 {
			return nil
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO ledger (amount) VALUES (-100)`)
		return err
	}
}

// TestNewerHolderSeesTheMarkHoldersLastCommit is the PostgreSQL review's
// case on InnoDB, at every pair of isolation levels, on InTx and on Guard:
// balance 150; the holder of the mark (token 5), in its second
// transaction, has been guarded and holds the guard row while a newer
// holder (token 6) is guarded; the older withdraws 100 and commits. The
// newer holder must read 50, or be refused with an error matching
// ErrRetryable and read 50 when run again: reading 150 leaves -50.
func TestNewerHolderSeesTheMarkHoldersLastCommit(t *testing.T) {
	levels := []sql.IsolationLevel{sql.LevelReadCommitted, sql.LevelRepeatableRead, sql.LevelSerializable}
	paths := []struct {
		name string
		run  func(ctx context.Context, db *sql.DB, level sql.IsolationLevel, f fence.Fence, fn mysql.TxFunc) error
	}{
		{"InTx", func(ctx context.Context, db *sql.DB, level sql.IsolationLevel, f fence.Fence, fn mysql.TxFunc) error {
			return mysql.InTx(ctx, db, &sql.TxOptions{Isolation: level}, f, fn)
		}},
		{"Guard", func(ctx context.Context, db *sql.DB, level sql.IsolationLevel, f fence.Fence, fn mysql.TxFunc) error {
			tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: level})
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback() }()
			if err := mysql.Guard(ctx, tx, f); err != nil {
				return err
			}
			if err := fn(ctx, tx); err != nil {
				return err
			}
			return tx.Commit()
		}},
	}
	for _, path := range paths {
		for _, older := range levels {
			for _, newer := range levels {
				t.Run(fmt.Sprintf("%s/%s-then-%s", path.name, older, newer), func(t *testing.T) {
					ctx, db := setup(t)
					mustExec(t, ctx, db, `CREATE TABLE ledger (id bigint AUTO_INCREMENT PRIMARY KEY, amount bigint NOT NULL)`)
					mustExec(t, ctx, db, `INSERT INTO ledger (amount) VALUES (150)`)
					old, nu := fenceOf("acct", 5, "old"), fenceOf("acct", 6, "new")
					raise(t, ctx, db, old)
					guarded := make(chan int64, 1)
					release := make(chan struct{})
					oldDone := make(chan error, 1)
					var oldRead, newRead int64
					go func() {
						oldDone <- path.run(ctx, db, older, old, func(ctx context.Context, tx *sql.Tx) error {
							var id int64
							if err := tx.QueryRowContext(ctx, `SELECT CONNECTION_ID()`).Scan(&id); err != nil {
								return err
							}
							guarded <- id
							select {
							case <-release:
							case <-ctx.Done():
								return ctx.Err()
							}
							return withdraw(&oldRead)(ctx, tx)
						})
					}()
					var oldID int64
					select {
					case oldID = <-guarded:
					case err := <-oldDone:
						t.Fatalf("older holder: %v", err)
					}
					newDone := make(chan error, 1)
					go func() { newDone <- path.run(ctx, db, newer, nu, withdraw(&newRead)) }()
					waitBlockedBy(t, ctx, db, oldID)
					close(release)
					if err := <-oldDone; err != nil || oldRead != 150 {
						t.Fatalf("older holder at %s: %v, read %d (want 150)", older, err, oldRead)
					}
					err := <-newDone
					switch {
					case errors.Is(err, mysql.ErrRetryable):
						if err := path.run(ctx, db, newer, nu, withdraw(&newRead)); err != nil {
							t.Fatalf("newer holder at %s, run again: %v", newer, err)
						}
						if newRead != 50 {
							t.Errorf("newer holder at %s read %d when run again, want 50", newer, newRead)
						}
					case err != nil:
						t.Fatalf("newer holder at %s: %v", newer, err)
					case newRead != 50:
						t.Errorf("newer holder at %s (older at %s) was admitted and read %d, want 50 or a retryable refusal", newer, older, newRead)
					}
					var bal int64
					if err := db.QueryRowContext(ctx, `SELECT SUM(amount) FROM ledger`).Scan(&bal); err != nil {
						t.Fatal(err)
					}
					if bal != 50 {
						t.Errorf("balance = %d, want 50", bal)
					}
				})
			}
		}
	}
}

// waitBlockedBy polls until a transaction waits for a lock that the
// transaction of server connection id holds: a waiter of the test's own.
func waitBlockedBy(t testing.TB, ctx context.Context, db mysql.Querier, id int64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var n int
		err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.INNODB_LOCK_WAITS w
JOIN information_schema.INNODB_TRX b ON b.trx_id = w.blocking_trx_id
WHERE b.trx_mysql_thread_id = ?`, id).Scan(&n)
		if err != nil {
			t.Fatalf("INNODB_LOCK_WAITS: %v", err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no transaction ever waited for connection %d", id)
		}
		// InnoDB refreshes what these tables show only when nobody read
		// them for 100 ms: polling faster would see the same snapshot.
		time.Sleep(150 * time.Millisecond)
	}
}
