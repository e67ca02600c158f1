package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/migrations"
	"github.com/fencekit/fencekit/storage/postgres"
)

var isoLevels = []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable}

// withdraw is the body of a fenced withdrawal of 100 from a balance kept
// as a ledger (the balance is the sum of its rows): it reads the balance,
// and writes a row of -100 only when the balance covers it. The ledger is
// written by inserts, so no row the older holder wrote is updated again:
// only the guard can tell a newer holder that its snapshot is too old.
func withdraw(read *int64) postgres.TxFunc {
	return func(ctx context.Context, tx pgx.Tx) error {
		var bal int64
		if err := tx.QueryRow(ctx, `SELECT sum(amount) FROM ledger`).Scan(&bal); err != nil {
			return err
		}
		*read = bal
		if bal < 100 {
			return nil
		}
		_, err := tx.Exec(ctx, `INSERT INTO ledger (amount) VALUES (-100)`)
		return err
	}
}

// isoPaths are the two ways a pgx caller guards its own work: InTx, and
// Guard as the first statement of a transaction the caller began.
var isoPaths = []struct {
	name string
	run  func(ctx context.Context, pool *pgxpool.Pool, level pgx.TxIsoLevel, f fence.Fence, fn postgres.TxFunc) error
}{
	{"InTx", func(ctx context.Context, pool *pgxpool.Pool, level pgx.TxIsoLevel, f fence.Fence, fn postgres.TxFunc) error {
		return postgres.InTx(ctx, pool, pgx.TxOptions{IsoLevel: level}, f, fn)
	}},
	{"Guard", func(ctx context.Context, pool *pgxpool.Pool, level pgx.TxIsoLevel, f fence.Fence, fn postgres.TxFunc) error {
		tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: level})
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if err := postgres.Guard(ctx, tx, f); err != nil {
			return err
		}
		if err := fn(ctx, tx); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}},
}

// TestNewerHolderSeesTheMarkHoldersLastCommit is the review's case at every
// pair of isolation levels, on InTx and on Guard: balance 150; the holder
// of the mark (token 5), in its second transaction, has been guarded and
// holds the guard row while a newer holder (token 6) is guarded; the older
// withdraws 100 and commits. The newer holder must then read 50 or be
// refused with an error matching ErrRetryable (and read 50 when it runs
// again): reading 150 withdraws a second time and leaves -50.
func TestNewerHolderSeesTheMarkHoldersLastCommit(t *testing.T) {
	for _, path := range isoPaths {
		for _, older := range isoLevels {
			for _, newer := range isoLevels {
				t.Run(fmt.Sprintf("%s/%s-then-%s", path.name, older, newer), func(t *testing.T) {
					newerHolderCase(t, path.run, older, newer)
				})
			}
		}
	}
}

// TestNewerHolderSeesTheMarkHoldersLastCommitAtTheDatabaseDefault is the
// same case with both transactions at the level the database's
// default_transaction_isolation gives (TxOptions left zero), on a database
// of the test's own set to REPEATABLE READ and to SERIALIZABLE: the guard
// cannot learn the level from its caller.
func TestNewerHolderSeesTheMarkHoldersLastCommitAtTheDatabaseDefault(t *testing.T) {
	for _, level := range []string{"repeatable read", "serializable"} {
		for _, path := range isoPaths {
			t.Run(path.name+"/"+level, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				u, drop := testenv.PostgresDatabase(t, testenv.PostgresBaseURL(t), "fk_isodefault_")
				t.Cleanup(drop)
				conn, err := pgx.Connect(ctx, u)
				if err != nil {
					t.Fatal(err)
				}
				var name string
				if err := conn.QueryRow(ctx, `SELECT current_database()`).Scan(&name); err != nil {
					t.Fatal(err)
				}
				_, err = conn.Exec(ctx, `ALTER DATABASE `+pgx.Identifier{name}.Sanitize()+` SET default_transaction_isolation = '`+level+`'`)
				_ = conn.Close(ctx)
				if err != nil {
					t.Fatal(err)
				}
				pool, err := pgxpool.New(ctx, u)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(pool.Close) // registered after drop, so it runs first
				db := stdlib.OpenDBFromPool(pool)
				err = migrations.Up(ctx, db)
				_ = db.Close()
				if err != nil {
					t.Fatal(err)
				}
				var got string
				if err := pool.QueryRow(ctx, `SHOW default_transaction_isolation`).Scan(&got); err != nil || got != level {
					t.Fatalf("default_transaction_isolation = %q (%v), want %q", got, err, level)
				}
				newerHolderOn(t, ctx, pool, path.run, "", "")
			})
		}
	}
}

func newerHolderCase(t *testing.T, run func(context.Context, *pgxpool.Pool, pgx.TxIsoLevel, fence.Fence, postgres.TxFunc) error, older, newer pgx.TxIsoLevel) {
	ctx, pool := setup(t)
	newerHolderOn(t, ctx, pool, run, older, newer)
}

// newerHolderOn is newerHolderCase on pool, a migrated database.
func newerHolderOn(t *testing.T, ctx context.Context, pool *pgxpool.Pool, run func(context.Context, *pgxpool.Pool, pgx.TxIsoLevel, fence.Fence, postgres.TxFunc) error, older, newer pgx.TxIsoLevel) {
	mustExec(t, ctx, pool, `CREATE TABLE ledger (id serial PRIMARY KEY, amount bigint NOT NULL)`)
	mustExec(t, ctx, pool, `INSERT INTO ledger (amount) VALUES (150)`)
	old, nu := fenceOf("acct", 5, "old"), fenceOf("acct", 6, "new")
	raise(t, ctx, pool, old) // the mark holder's first transaction

	guarded := make(chan uint32, 1)
	release := make(chan struct{})
	oldDone := make(chan error, 1)
	var oldRead int64
	go func() {
		oldDone <- run(ctx, pool, older, old, func(ctx context.Context, tx pgx.Tx) error {
			guarded <- tx.Conn().PgConn().PID()
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
			return withdraw(&oldRead)(ctx, tx)
		})
	}()
	var oldPID uint32
	select {
	case oldPID = <-guarded:
	case err := <-oldDone:
		t.Fatalf("older holder: %v", err)
	}
	newDone := make(chan error, 1)
	var newRead int64
	go func() { newDone <- run(ctx, pool, newer, nu, withdraw(&newRead)) }()
	waitBlockedBy(t, ctx, pool, oldPID)
	close(release)
	if err := <-oldDone; err != nil {
		t.Fatalf("older holder at %s: %v", older, err)
	}
	if oldRead != 150 {
		t.Fatalf("older holder read %d, want 150", oldRead)
	}
	err := <-newDone
	switch {
	case errors.Is(err, postgres.ErrRetryable) || serializationFailure(err):
		// Run again, as Retry would: now it must see the older's commit.
		if err := run(ctx, pool, newer, nu, withdraw(&newRead)); err != nil {
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
	if err := pool.QueryRow(ctx, `SELECT sum(amount) FROM ledger`).Scan(&bal); err != nil {
		t.Fatal(err)
	}
	if bal != 50 {
		t.Errorf("balance = %d after the older's withdrawal and the newer's, want 50", bal)
	}
}

// serializationFailure reports a 40001 from the caller's own statements or
// COMMIT after Guard (InTx translates those to ErrRetryable; a caller's own
// transaction returns pgx's error).
func serializationFailure(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "40001"
}

// waitBlockedBy polls until some backend waits for a lock that backend
// holder holds: a waiter of the test's own, whatever else runs on the
// server.
func waitBlockedBy(t testing.TB, ctx context.Context, db postgres.Querier, holder uint32) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var n int
		err := db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1::int = ANY(pg_blocking_pids(pid))`, int32(holder)).Scan(&n)
		if err != nil {
			t.Fatalf("pg_blocking_pids: %v", err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no backend ever waited for backend %d", holder)
		}
		time.Sleep(5 * time.Millisecond) // polling interval, not a wait for the condition itself
	}
}
