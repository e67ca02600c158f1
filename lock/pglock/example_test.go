package pglock_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lock/pglock"
	"github.com/fencekit/fencekit/migrations"
)

// A Locker on PostgreSQL alone: migrate once, then lock through the same
// pool the application writes with. The lock's tables go in the schema
// the pool's search_path names (here one of the example's own).
func ExampleNew() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test?sslmode=disable&search_path=fencekit_example")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS fencekit_example`); err != nil {
		log.Fatal(err)
	}
	if err := migrations.UpPool(ctx, pool); err != nil { // once per database
		log.Fatal(err)
	}

	locker, err := pglock.New(pool)
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()
	err = locker.Do(ctx, "invoice:42", 10*time.Second, func(ctx context.Context, f fence.Fence) error {
		// Present f with every write made under the lock (storage/postgres).
		fmt.Println(f.Resource, f.Token > 0)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output: invoice:42 true
}
