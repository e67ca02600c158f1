package migrations_test

import (
	"testing"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/migrations"
)

// TestUpPool applies the migrations through a pgx pool in the test's own
// schema, twice, and the pool stays usable afterwards.
func TestUpPool(t *testing.T) {
	ctx := testCtx(t)
	pool := testenv.Postgres(t)
	for i := range 2 {
		if err := migrations.UpPool(ctx, pool); err != nil {
			t.Fatalf("UpPool, run %d: %v", i+1, err)
		}
	}
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("pool after UpPool: %v", err)
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM fencekit_guard").Scan(&n); err != nil {
		t.Fatalf("guard table in the pool's schema: %v", err)
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	checkAppliedOnce(t, ctx, db)
}

func TestUpPoolNil(t *testing.T) {
	if err := migrations.UpPool(t.Context(), nil); err == nil {
		t.Fatal("UpPool(nil) returned nil")
	}
}
