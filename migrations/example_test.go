package migrations_test

import (
	"context"
	"database/sql"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/fencekit/fencekit/migrations"
)

// Apply fencekit's schema at start-up. Several instances may do this at once.
func ExampleUp() {
	db, err := sql.Open("pgx", "postgres://postgres@127.0.0.1:5432/test")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if err := migrations.Up(context.Background(), db); err != nil {
		log.Fatal(err)
	}
}

// A program that already has a pgx pool passes it; the pool stays open.
func ExampleUpPool() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := migrations.UpPool(ctx, pool); err != nil {
		log.Fatal(err)
	}
}
