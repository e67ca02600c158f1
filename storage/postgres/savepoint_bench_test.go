package postgres_test

import (
	"testing"

	"github.com/fencekit/fencekit/storage/postgres"
)

// BenchmarkGuard is BenchmarkInTx's transaction begun by the caller and
// fenced with Guard, whose savepoint check rides in the guard's batch:
// compare the two to see what the check costs.
//
//	go test -run '^$' -bench 'InTx|Guard$' -count 6 ./storage/postgres
func BenchmarkGuard(b *testing.B) {
	ctx, pool := setup(b)
	f := fenceOf("counter", 1, "h")
	run := func() error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		if err := postgres.Guard(ctx, tx, f); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, benchUpdate, 1); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	if err := run(); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := run(); err != nil {
			b.Fatal(err)
		}
	}
}
