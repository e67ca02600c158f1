package postgres_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/storage/postgres"
)

// countedConnect opens a connection like pool's whose writes (flights of
// messages, round trips in a request-response exchange) are counted in
// writes.
func countedConnect(t *testing.T, ctx context.Context, pool *pgxpool.Pool, writes *atomic.Int64) *pgx.Conn {
	t.Helper()
	var reads atomic.Int64
	cfg := pool.Config().ConnConfig.Copy()
	dial := cfg.DialFunc
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countingConn{Conn: c, writes: writes, reads: &reads}, nil
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// InTx on a connection sends BEGIN and the guard in one flight, so a fenced
// transaction of one UPDATE takes the three round trips of the plain one
// (BEGIN, UPDATE, COMMIT), whatever the isolation level; a stale fence's
// mark comes with the refusal, and fn does not run.
func TestInTxBeginsAndGuardsInOneFlight(t *testing.T) {
	ctx, pool := setup(t)
	var writes atomic.Int64
	conn := countedConnect(t, ctx, pool, &writes)
	const update = `UPDATE counter SET n = n + 1 WHERE id = $1`
	f := fenceOf("counter", 2, "h")
	flights := func(name string, op func() error) int64 {
		t.Helper()
		if err := op(); err != nil { // warm the statement cache
			t.Fatalf("%s: %v", name, err)
		}
		w0 := writes.Load()
		if err := op(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		w := writes.Load() - w0
		t.Logf("%s: %d flights", name, w)
		return w
	}
	plain := func() error {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, update, 1); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	fenced := func(opts pgx.TxOptions) func() error {
		return func() error {
			return postgres.InTx(ctx, conn, opts, f, func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, update, 1)
				return err
			})
		}
	}
	wp := flights("plain", plain)
	wf := flights("InTx", fenced(pgx.TxOptions{}))
	wr := flights("InTx, REPEATABLE READ", fenced(pgx.TxOptions{IsoLevel: pgx.RepeatableRead}))
	if wp != 3 || wf != 3 || wr != 3 {
		t.Fatalf("plain transaction took %d flights, InTx %d, InTx at REPEATABLE READ %d; want 3 each", wp, wf, wr)
	}
	if n, _ := counter(t, ctx, pool); n != 6 {
		t.Fatalf("n = %d, want 6", n)
	}

	ran := false
	stale := func() error {
		err := postgres.InTx(ctx, conn, pgx.TxOptions{}, fenceOf("counter", 1, "old"), func(context.Context, pgx.Tx) error {
			ran = true
			return nil
		})
		wantStale(t, err, f)
		return nil
	}
	// The refusal carries the mark: the batch and the rollback. pgx forgets
	// a batch's prepared statements after any error in it, so a call after
	// a refusal first deallocates and prepares them again: two more.
	if w := flights("InTx, stale", stale); w > 4 || ran {
		t.Fatalf("a stale InTx took %d flights (ran %v), want at most 4 and fn not run", w, ran)
	}
	if conn.PgConn().TxStatus() != 'I' {
		t.Fatalf("the connection is left in transaction status %q, want idle", conn.PgConn().TxStatus())
	}
	if n, _ := counter(t, ctx, pool); n != 6 {
		t.Fatalf("n = %d after stale calls, want 6", n)
	}
}

// A stale InTx on a pool gives its connection back: the pool's one
// connection serves the next call.
func TestInTxStaleReleasesThePoolConnection(t *testing.T) {
	ctx, pool := setup(t)
	cfg := pool.Config()
	cfg.MaxConns = 1
	one, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	raise(t, ctx, one, fenceOf("counter", 5, "new"))
	for range 3 {
		err := postgres.InTx(ctx, one, pgx.TxOptions{}, fenceOf("counter", 4, "old"), func(context.Context, pgx.Tx) error { return nil })
		wantStale(t, err, fenceOf("counter", 5, "new"))
	}
	if got := mark(t, ctx, one, "counter"); got != (fence.Fence{Resource: "counter", Token: 5, Holder: "new"}) {
		t.Fatalf("mark %v", got)
	}
}

// Guard on a transaction of the caller's is one flight, a stale one too:
// the savepoint check in the guard's batch reads the mark the refusal
// carries.
func TestGuardStaleIsOneFlight(t *testing.T) {
	ctx, pool := setup(t)
	newer := fenceOf("counter", 5, "new")
	raise(t, ctx, pool, newer)
	var writes atomic.Int64
	conn := countedConnect(t, ctx, pool, &writes)
	for i := range 2 { // the second with the statements cached
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		w0 := writes.Load()
		err = postgres.Guard(ctx, tx, fenceOf("counter", 4, "old"))
		w := writes.Load() - w0
		wantStale(t, err, newer)
		err = postgres.GuardAll(ctx, tx, fenceOf("counter", 4, "old"))
		wantStale(t, err, newer)
		_ = tx.Rollback(ctx)
		if i == 1 && w != 1 {
			t.Fatalf("a stale Guard took %d flights, want 1", w)
		}
	}
}
