package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/storage/postgres"
)

// A fenced read-modify-write: the guard admits the fence first, so the read
// and the write inside the transaction cannot be overtaken by an older
// holder.
func ExampleInTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	// f comes from the lock, e.g. lease.Fence().
	f := fence.Fence{Resource: "account:42", Token: 7, Holder: fence.NewHolder()}
	err = postgres.InTx(ctx, pool, pgx.TxOptions{}, f, func(ctx context.Context, tx pgx.Tx) error {
		var balance int64
		if err := tx.QueryRow(ctx, `SELECT balance FROM accounts WHERE id = $1`, 42).Scan(&balance); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE accounts SET balance = $1 WHERE id = $2`, balance+100, 42)
		return err
	})
	if errors.Is(err, fence.ErrStale) {
		hw, _ := fence.LostTo(err)
		fmt.Println("a newer holder was admitted:", hw.Token)
		return
	}
	if err != nil {
		log.Fatal(err)
	}
}

// A fenced write in one round trip: guard and statements are pipelined and
// commit together, or not at all.
func ExampleExec() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	f := fence.Fence{Resource: "account:42", Token: 7, Holder: fence.NewHolder()}
	_, err = postgres.Exec(ctx, pool, f,
		postgres.Statement{SQL: `UPDATE accounts SET balance = balance + $1 WHERE id = $2`, Args: []any{100, 42}},
		postgres.Statement{SQL: `INSERT INTO ledger (account, amount) VALUES ($1, $2)`, Args: []any{42, 100}},
	)
	if err != nil {
		log.Fatal(err)
	}
}

// Row-level fencing for a table that carries its own fence columns
// (fence_token bigint, fence_holder text).
func ExampleTable_Update() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	jobs := postgres.Table{Name: pgx.Identifier{"jobs"}, Key: "id"}
	f := fence.Fence{Resource: "job:9", Token: 3, Holder: fence.NewHolder()}
	err = jobs.Update(ctx, pool, f, 9, postgres.Set("state", "done"))
	switch {
	case errors.Is(err, fence.ErrStale):
		fmt.Println("another worker took the job over")
	case errors.Is(err, fence.ErrNotFound):
		fmt.Println("no such job")
	case err != nil:
		log.Fatal(err)
	}
}

// Optimistic locking on a version column, retried on conflicts.
func ExampleTable_UpdateVersion() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	docs := postgres.Table{Name: pgx.Identifier{"docs"}, Key: "id"}
	err = postgres.Retry(ctx, 0, func(ctx context.Context) error {
		var body string
		var version int64
		if err := pool.QueryRow(ctx, `SELECT body, version FROM docs WHERE id = $1`, 1).Scan(&body, &version); err != nil {
			return err
		}
		_, err := docs.UpdateVersion(ctx, pool, 1, version, postgres.Set("body", body+"!"))
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
}

// The lock's counter healing reads the guard table's mark.
func ExampleHighWater() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	hw, err := postgres.HighWater(ctx, pool, "account:42")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("next token must exceed", hw.Token)
}

// Run a day's draw at most once, whoever holds the lock and however often
// the job is started: the draw and its completion record commit together.
func ExampleOnce() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	f := fence.Fence{Resource: "lottery", Token: 7, Holder: fence.NewHolder()}
	ran, err := postgres.Once(ctx, pool, f, "draw:2026-11-23", func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO draws (day, winner) VALUES ($1, $2)`, "2026-11-23", 42)
		return err
	})
	switch {
	case errors.Is(err, fence.ErrOutcomeUnknown):
		// The COMMIT's reply was lost: call Once again, it tells the truth.
	case err != nil:
		log.Fatal(err)
	case !ran:
		rec, err := postgres.LookupOnce(ctx, pool, "draw:2026-11-23")
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("already drawn with token", rec.Token, "by", rec.HolderMark, "at", rec.Done)
	}
}
