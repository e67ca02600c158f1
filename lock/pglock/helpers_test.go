package pglock

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/migrations"
)

// migratedPool is a pool in a schema of t's own, with the migrations
// applied.
func migratedPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool := testenv.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := migrations.UpPool(ctx, pool); err != nil {
		t.Fatalf("migrations: %v", err)
	}
	return pool
}

// poolAt is a pool of url with the search_path of base (a pool from
// migratedPool), closed when t ends.
func poolAt(t testing.TB, base *pgxpool.Pool, rawURL string, params map[string]string) *pgxpool.Pool {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	if base != nil {
		q.Set("search_path", base.Config().ConnConfig.RuntimeParams["search_path"])
	}
	for k, v := range params {
		q.Set(k, v)
	}
	u.RawQuery = q.Encode()
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// testBackend is a backend on pool with cfg, closed when t ends.
func testBackend(t testing.TB, pool *pgxpool.Pool, cfg config) *backend {
	t.Helper()
	if cfg.retention == 0 {
		cfg.retention = time.Minute
	}
	b := newBackend(pool, cfg)
	t.Cleanup(b.close)
	if b.listen != nil {
		select {
		case <-b.listen.upped():
		case <-time.After(10 * time.Second):
			t.Fatal("the listener did not LISTEN within 10s")
		}
	}
	return b
}

func ctxFor(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// rowOf reads resource's lock row: its counter, and whether it exists.
func rowOf(t testing.TB, pool *pgxpool.Pool, resource string) (int64, bool) {
	t.Helper()
	var token int64
	err := pool.QueryRow(context.Background(), `SELECT token FROM fencekit_lock WHERE resource = $1`, resource).Scan(&token)
	if err != nil {
		return 0, false
	}
	return token, true
}

// waiters counts resource's queue entries.
func waiters(t testing.TB, pool *pgxpool.Pool, resource string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM fencekit_lock_waiter WHERE resource = $1`, resource).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// eventually polls cond every 10ms until it holds or d has passed.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// isGrantSQL reports whether sql is a grant statement of the backend's:
// grantSQL (or a broken variant of it) or, on an older schema, acquireSQL.
func isGrantSQL(sql string) bool {
	return strings.Contains(sql, "fencekit_lock_grant") || sql == acquireSQL
}
