// Command quickstart is the README's quick start as a complete program. It
// takes a lock on invoice 42 and, under it, makes a fenced read-modify-write
// in PostgreSQL and a fenced read-modify-write of a value kept in Redis. Each
// run adds 5 to the invoice's total in both stores.
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
	"flag"
	"fmt"
	"log"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lock"
	"github.com/fencekit/fencekit/migrations"
	"github.com/fencekit/fencekit/storage/postgres"
	fkredis "github.com/fencekit/fencekit/storage/redis" // its package name is go-redis's
)

func main() {
	redisAddr := flag.String("redis", "127.0.0.1:6379", "Redis address (host:port)")
	postgresURL := flag.String("postgres", "postgres://postgres@127.0.0.1:5432/test", "PostgreSQL URL")
	flag.Parse()
	if err := run(context.Background(), *redisAddr, *postgresURL); err != nil {
		log.Fatal("quickstart: ", err)
	}
}

func run(ctx context.Context, redisAddr, postgresURL string) error {
	client := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
	defer client.Close()
	pool, err := pgxpool.New(ctx, postgresURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := migrations.UpPool(ctx, pool); err != nil { // fencekit's guard table, once per database
		return fmt.Errorf("apply migrations: %w", err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS invoices (id bigint PRIMARY KEY, total bigint NOT NULL);
		INSERT INTO invoices VALUES (42, 0) ON CONFLICT DO NOTHING`); err != nil {
		return err
	}
	locker, err := lock.New(client)
	if err != nil {
		return err
	}
	defer locker.Close()
	store, err := fkredis.New(client)
	if err != nil {
		return err
	}

	return locker.Do(ctx, "invoice:42", 10*time.Second, func(ctx context.Context, f fence.Fence) error {
		fmt.Println("lock taken, fence", f) // present f with every read and write made under the lock
		var total int64
		err := postgres.InTx(ctx, pool, pgx.TxOptions{}, f, func(ctx context.Context, tx pgx.Tx) error {
			return tx.QueryRow(ctx, `UPDATE invoices SET total = total + 5 WHERE id = 42 RETURNING total`).Scan(&total)
		})
		if err != nil {
			return err // errors.Is(err, fence.ErrStale): a newer holder was admitted, so drop the work
		}
		fmt.Println("PostgreSQL: invoice 42 total is now", total)
		v, err := store.FencedUpdate(ctx, f, "invoice:42:total", func(old fkredis.Value) ([]byte, error) {
			n, _ := strconv.ParseInt(string(old.Data), 10, 64) // a missing value reads as 0
			return strconv.AppendInt(nil, n+5, 10), nil
		})
		if err != nil {
			return err
		}
		fmt.Printf("Redis: invoice:42:total is now %s\n", v.Data)
		return nil
	})
}

// README quick start: end
