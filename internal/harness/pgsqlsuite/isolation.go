package pgsqlsuite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/pgcore"
	"github.com/fencekit/fencekit/storage/pgsql"
)

func init() {
	register(test{"NewerHolderSeesTheMarkHoldersLastCommit", testNewerHolderSeesLastCommit})
}

// withdraw is fn for a fenced withdrawal of 100 from a balance kept as a
// ledger (the balance is the sum of its rows): it reads the balance into
// *read and writes a row of -100 only when the balance covers it. Inserts
// never update a row the older holder wrote, so only the guard can tell a
// newer holder that its snapshot is too old.
func withdraw(read *int64) pgsql.TxFunc {
	return func(ctx context.Context, tx *sql.Tx) error {
		var bal int64
		if err := tx.QueryRowContext(ctx, `SELECT sum(amount) FROM ledger`).Scan(&bal); err != nil {
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

// isoPaths are the two ways a database/sql caller guards its work: InTx,
// and Guard as the first statement of a transaction it began.
var isoPaths = []struct {
	name string
	run  func(ctx context.Context, db *sql.DB, level sql.IsolationLevel, f fence.Fence, fn pgsql.TxFunc) error
}{
	{"InTx", func(ctx context.Context, db *sql.DB, level sql.IsolationLevel, f fence.Fence, fn pgsql.TxFunc) error {
		return pgsql.InTx(ctx, db, &sql.TxOptions{Isolation: level}, f, fn)
	}},
	{"Guard", func(ctx context.Context, db *sql.DB, level sql.IsolationLevel, f fence.Fence, fn pgsql.TxFunc) error {
		tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: level})
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		if err := pgsql.Guard(ctx, tx, f); err != nil {
			return err
		}
		if err := fn(ctx, tx); err != nil {
			return err
		}
		return tx.Commit()
	}},
}

// testNewerHolderSeesLastCommit is the review's case at every pair of
// isolation levels, on InTx and on Guard: balance 150; the holder of the
// mark (token 5), in its second transaction, has been guarded and holds the
// guard row while a newer holder (token 6) is guarded; the older withdraws
// 100 and commits. The newer holder must then read 50, or be refused with a
// serialization failure (ErrRetryable from the guard) and read 50 when run
// again: reading 150 withdraws a second time and leaves -50.
func testNewerHolderSeesLastCommit(t *testing.T, d Driver) {
	for _, path := range isoPaths {
		for _, older := range levels {
			for _, newer := range levels {
				t.Run(fmt.Sprintf("%s/%s-then-%s", path.name, older, newer), func(t *testing.T) {
					e := setup(t, d)
					e.exec(`CREATE TABLE ledger (id serial PRIMARY KEY, amount bigint NOT NULL)`)
					e.exec(`INSERT INTO ledger (amount) VALUES (150)`)
					old, nu := fenceOf("acct", 5, "old"), fenceOf("acct", 6, "new")
					e.raise(old) // the mark holder's first transaction
					guarded := make(chan int64, 1)
					release := make(chan struct{})
					oldDone := make(chan error, 1)
					var oldRead int64
					go func() {
						oldDone <- path.run(e.ctx, e.db, older, old, func(ctx context.Context, tx *sql.Tx) error {
							var p int64
							if err := tx.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&p); err != nil {
								return err
							}
							guarded <- p
							select {
							case <-release:
							case <-ctx.Done():
								return ctx.Err()
							}
							return withdraw(&oldRead)(ctx, tx)
						})
					}()
					var oldPID int64
					select {
					case oldPID = <-guarded:
					case err := <-oldDone:
						t.Fatalf("older holder: %v", err)
					}
					newDone := make(chan error, 1)
					var newRead int64
					go func() { newDone <- path.run(e.ctx, e.db, newer, nu, withdraw(&newRead)) }()
					e.waitBlockedBy(oldPID)
					close(release)
					if err := <-oldDone; err != nil || oldRead != 150 {
						t.Fatalf("older holder at %s: %v, read %d (want 150)", older, err, oldRead)
					}
					err := <-newDone
					switch {
					case errors.Is(err, pgsql.ErrRetryable) || serializationFailure(err):
						if err := path.run(e.ctx, e.db, newer, nu, withdraw(&newRead)); err != nil {
							t.Fatalf("newer holder at %s, run again: %v", newer, err)
						}
						if newRead != 50 {
							t.Errorf("newer holder at %s read %d when run again, want 50", newer, newRead)
						}
					case err != nil:
						t.Fatalf("newer holder at %s: %v", newer, err)
					case newRead != 50:
						t.Errorf("newer holder at %s (older at %s) was admitted and read %d, want 50 (the older holder's commit) or a retryable refusal", newer, older, newRead)
					}
					var bal int64
					if err := e.db.QueryRowContext(e.ctx, `SELECT sum(amount) FROM ledger`).Scan(&bal); err != nil {
						t.Fatal(err)
					}
					if bal != 50 {
						t.Errorf("balance = %d after the older's withdrawal and the newer's, want 50", bal)
					}
				})
			}
		}
	}
}

// serializationFailure reports a 40001 from the caller's own statements or
// COMMIT after Guard, which the driver returns as it is.
func serializationFailure(err error) bool {
	s, ok := pgcore.AsServerError(err)
	return ok && s.Code == pgcore.CodeSerializationFailure
}

// waitBlockedBy polls until some backend waits for a lock that backend
// holder holds: a waiter of the test's own, whatever else runs on the
// server.
func (e *env) waitBlockedBy(holder int64) {
	e.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var n int
		err := e.db.QueryRowContext(e.ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1::int = ANY(pg_blocking_pids(pid))`, holder).Scan(&n)
		if err != nil {
			e.t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("no backend ever waited for backend %d", holder)
		}
		time.Sleep(10 * time.Millisecond) // polling interval, not a wait for the condition itself
	}
}
