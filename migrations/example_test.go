package migrations_test

import (
	"context"
	"database/sql"
	"log"

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
