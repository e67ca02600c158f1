// Command quickstart is the README's quick start as a complete program. It
// takes a lock on invoice 42 and, under it, makes a fenced read-modify-write
// and a fenced blind write in PostgreSQL and a fenced read-modify-write of a
// value kept in Redis. Each run adds 5 to the invoice's total in both stores.
//
// Usage:
//
//	go run ./examples/quickstart [-redis 127.0.0.1:6379] [-postgres postgres://postgres@127.0.0.1:5432/test]
//
// It writes the table invoices (row 42), fencekit's guard tables, the Redis
// keys of the lock on "invoice:42" and the value "invoice:42:total", and
// exits with status 1 on any error.
package main

// README quick start: begin
import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/lock"
	"github.com/fencekit/fencekit/migrations"
	"github.com/fencekit/fencekit/storage/postgres"
	fkredis "github.com/fencekit/fencekit/storage/redis"
)

func main() {
	redisAddr := flag.String("redis", "127.0.0.1:6379", "Redis address (host:port)")
	postgresURL := flag.String("postgres", "postgres://postgres@127.0.0.1:5432/test", "PostgreSQL URL")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "quickstart: a lock on invoice 42 and fenced writes to PostgreSQL and Redis under it\n\nflags:")
		flag.PrintDefaults()
	}
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx, os.Stdout, *redisAddr, *postgresURL); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

// run takes a lock on invoice 42 and, under it, updates the invoice in
// PostgreSQL and its total in Redis, each write fenced.
func run(ctx context.Context, out io.Writer, redisAddr, postgresURL string) (err error) {
	client := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer client.Close()
	pool, err := pgxpool.New(ctx, postgresURL)
	if err != nil {
		return err
	}
	defer pool.Close()

	// Once per database: fencekit's guard table, then the application's table.
	if err := migrations.UpPool(ctx, pool); err != nil {
		return fmt.Errorf("apply migrations: %w", err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS invoices (
		id bigint PRIMARY KEY, total bigint NOT NULL DEFAULT 0, paid boolean NOT NULL DEFAULT false)`); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `INSERT INTO invoices (id) VALUES (42) ON CONFLICT DO NOTHING`); err != nil {
		return err
	}

	locker, err := lock.New(client)
	if err != nil {
		return err
	}
	lease, err := locker.Acquire(ctx, "invoice:42", 10*time.Second) // one round trip: lock + token
	if err != nil {
		return err // Redis is down, or ctx ended: no lease, so nothing to write
	}
	defer func() { err = errors.Join(err, lease.Release(ctx)) }()
	f := lease.Fence() // present it with every read and write made under the lease
	fmt.Fprintf(out, "lock taken, fence %v\n", f)

	// A fenced read-modify-write in PostgreSQL. The guard runs first: no
	// older holder can write until this transaction commits.
	var total int64
	err = postgres.InTx(ctx, pool, pgx.TxOptions{}, f, func(ctx context.Context, tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT total FROM invoices WHERE id = $1`, 42).Scan(&total); err != nil {
			return err
		}
		total += 5
		_, err := tx.Exec(ctx, `UPDATE invoices SET total = $1 WHERE id = $2`, total, 42)
		return err
	})
	if err != nil {
		return err // errors.Is(err, fence.ErrStale): a newer holder was admitted, so drop the work
	}
	fmt.Fprintf(out, "PostgreSQL: invoice 42 total is now %d\n", total)

	// A blind write in one round trip: guard and statement pipelined, all or nothing.
	_, err = postgres.Exec(ctx, pool, f, postgres.Statement{SQL: `UPDATE invoices SET paid = true WHERE id = $1`, Args: []any{42}})
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "PostgreSQL: invoice 42 marked paid")

	// A fenced read-modify-write of a value kept in Redis.
	store, err := fkredis.New(client)
	if err != nil {
		return err
	}
	v, err := store.Update(ctx, f, "invoice:42:total", func(old fkredis.Value) ([]byte, error) {
		n, _ := strconv.Atoi(string(old.Data)) // a missing value reads as 0
		return strconv.AppendInt(nil, int64(n+5), 10), nil
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "Redis: invoice:42:total is now %s\n", v.Data)
	return nil
}

// README quick start: end
