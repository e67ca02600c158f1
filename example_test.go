package fencekit_test

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lock"
	"github.com/fencekit/fencekit/storage/postgres"
	fkredis "github.com/fencekit/fencekit/storage/redis"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// A lease and its fence, a fenced read-modify-write in PostgreSQL, a
// one-round-trip fenced write, and a fenced update of a value kept in Redis.
// The guard table and the invoices table must exist: examples/quickstart is
// the complete program, which creates them.
func Example() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test")
	if err != nil {
		panic(err)
	}
	locker, err := lock.New(client)
	if err != nil {
		panic(err)
	}

	lease, err := locker.Acquire(ctx, "invoice:42", 10*time.Second) // one round trip: lock + token
	if err != nil {
		panic(err)
	}
	defer lease.Release(ctx)
	f := lease.Fence() // present it with every read and write made under the lease

	err = postgres.InTx(ctx, pool, pgx.TxOptions{}, f, func(ctx context.Context, tx pgx.Tx) error {
		var total int64 // the guard ran first: no older holder can write until we commit
		if err := tx.QueryRow(ctx, `SELECT total FROM invoices WHERE id = $1`, 42).Scan(&total); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE invoices SET total = $1 WHERE id = $2`, total+5, 42)
		return err
	})
	if errors.Is(err, fence.ErrStale) {
		return // a newer holder was admitted: the work is theirs now
	}
	if err != nil {
		panic(err)
	}

	// A blind write in one round trip: guard and statements pipelined, all or nothing.
	_, err = postgres.Exec(ctx, pool, f, postgres.Statement{SQL: `UPDATE invoices SET paid = true WHERE id = $1`, Args: []any{42}})
	if err != nil {
		panic(err)
	}

	store, err := fkredis.New(client)
	if err != nil {
		panic(err)
	}
	_, err = store.FencedUpdate(ctx, f, "invoice:42:total", func(old fkredis.Value) ([]byte, error) {
		n, _ := strconv.Atoi(string(old.Data)) // a missing value reads as 0
		return strconv.AppendInt(nil, int64(n+5), 10), nil
	})
	if err != nil {
		panic(err)
	}
}
