package postgres_test

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/storage/postgres"
)

func TestExecAdmitsAndCommits(t *testing.T) {
	ctx, pool := setup(t)
	f := fenceOf("counter", 3, "a")
	tags, err := postgres.Exec(ctx, pool, f,
		postgres.Statement{SQL: `UPDATE counter SET n = n + 1, writer = $1 WHERE id = 1`, Args: []any{int64(3)}},
		postgres.Statement{SQL: `INSERT INTO counter (id, n) VALUES (2, 7)`},
	)
	if err != nil {
		t.Fatal(err)
	}
	if len(tags) != 2 || tags[0].RowsAffected() != 1 || !tags[1].Insert() {
		t.Fatalf("tags = %v", tags)
	}
	if n, w := counter(t, ctx, pool); n != 1 || w != 3 {
		t.Fatalf("counter = %d by %d, want 1 by 3", n, w)
	}
	if got := mark(t, ctx, pool, "counter"); got != f {
		t.Fatalf("mark = %v, want %v", got, f)
	}
	// The same fence again is admitted (same token, same holder).
	if _, err := postgres.Exec(ctx, pool, f, postgres.Statement{SQL: `UPDATE counter SET n = n + 1 WHERE id = 1`}); err != nil {
		t.Fatalf("re-entry: %v", err)
	}
}

func TestExecStaleCommitsNothing(t *testing.T) {
	for _, stale := range []fence.Fence{fenceOf("counter", 4, "a"), fenceOf("counter", 5, "b")} {
		t.Run(stale.String(), func(t *testing.T) {
			ctx, pool := setup(t)
			hwm := fenceOf("counter", 5, "a")
			raise(t, ctx, pool, hwm)
			tags, err := postgres.Exec(ctx, pool, stale,
				postgres.Statement{SQL: `UPDATE counter SET n = 99 WHERE id = 1`},
				postgres.Statement{SQL: `INSERT INTO counter (id, n) VALUES (2, 7)`},
			)
			wantStale(t, err, hwm)
			if tags != nil {
				t.Fatalf("tags = %v for a stale batch", tags)
			}
			if n, _ := counter(t, ctx, pool); n != 0 {
				t.Fatalf("n = %d after a stale batch, want 0", n)
			}
			var rows int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM counter`).Scan(&rows); err != nil {
				t.Fatal(err)
			}
			if rows != 1 {
				t.Fatalf("%d counter rows after a stale batch, want 1", rows)
			}
			if got := mark(t, ctx, pool, "counter"); got != hwm {
				t.Fatalf("mark = %v, want %v", got, hwm)
			}
		})
	}
}

// A failing statement aborts the whole batch, the guard's raise included:
// the batch is one transaction.
func TestExecFailingStatementRollsBackEverything(t *testing.T) {
	ctx, pool := setup(t)
	_, err := postgres.Exec(ctx, pool, fenceOf("counter", 7, "b"),
		postgres.Statement{SQL: `UPDATE counter SET n = 5 WHERE id = 1`},
		postgres.Statement{SQL: `INSERT INTO counter (id, n) VALUES (1, 0)`}, // duplicate key
	)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
		t.Fatalf("err = %v, want a unique violation", err)
	}
	if n, _ := counter(t, ctx, pool); n != 0 {
		t.Fatalf("n = %d, the first statement committed", n)
	}
	if got := mark(t, ctx, pool, "counter"); got.Token != 0 {
		t.Fatalf("mark = %v, the guard committed", got)
	}
}

// In the caller's transaction, a stale batch aborts that transaction.
func TestExecInTransaction(t *testing.T) {
	ctx, pool := setup(t)
	raise(t, ctx, pool, fenceOf("counter", 5, "a"))
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	mustExec(t, ctx, tx, `UPDATE counter SET n = 1 WHERE id = 1`)
	_, err = postgres.Exec(ctx, tx, fenceOf("counter", 1, "old"), postgres.Statement{SQL: `UPDATE counter SET n = 2 WHERE id = 1`})
	wantStale(t, err, fenceOf("counter", 5, "a"))
	if _, err := tx.Exec(ctx, `SELECT 1`); err == nil {
		t.Fatal("transaction still usable after a stale batch")
	}
	_ = tx.Rollback(ctx)
	if n, _ := counter(t, ctx, pool); n != 0 {
		t.Fatalf("n = %d, want 0", n)
	}
}

func TestExecNotMigrated(t *testing.T) {
	pool := testenv.Postgres(t)
	ctx := context.Background()
	_, err := postgres.Exec(ctx, pool, fenceOf("r", 1, "h"))
	if !errors.Is(err, postgres.ErrNotMigrated) {
		t.Fatalf("Exec without migrations = %v, want ErrNotMigrated", err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := postgres.Guard(ctx, tx, fenceOf("r", 1, "h")); !errors.Is(err, postgres.ErrNotMigrated) {
		t.Fatalf("Guard without migrations = %v, want ErrNotMigrated", err)
	}
}

// TestBefore00005: on a database migrated before 00005 (without
// fencekit_guard_try) every path keeps working: the guard's admission is a
// plain upsert, and only the raising refusal calls a function, 00002's
// fencekit_guard_admit. A guard in the caller's transaction is admitted and
// rolled back with it.
func TestBefore00005(t *testing.T) {
	ctx, pool := setup(t)
	mustExec(t, ctx, pool, `DROP FUNCTION IF EXISTS fencekit_guard_try(text, bigint, text)`)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	err = postgres.InTx(ctx, tx, pgx.TxOptions{}, fenceOf("counter", 1, "h"), func(context.Context, pgx.Tx) error {
		ran = true
		return nil
	})
	_ = tx.Rollback(ctx)
	if err != nil || !ran {
		t.Fatalf("InTx in a transaction without fencekit_guard_try = %v (ran %v), want it admitted", err, ran)
	}
	if m, err := postgres.HighWater(ctx, pool, "counter"); err != nil || m.Token != 0 {
		t.Fatalf("mark = %v, %v, want none", m, err)
	}
	if _, err := postgres.Exec(ctx, pool, fenceOf("counter", 2, "h"), postgres.Statement{SQL: `UPDATE counter SET n = 2 WHERE id = 1`}); err != nil {
		t.Fatalf("Exec without fencekit_guard_try = %v, want it admitted", err)
	}
	err = postgres.InTx(ctx, pool, pgx.TxOptions{}, fenceOf("counter", 3, "h"), func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE counter SET n = 3 WHERE id = 1`)
		return err
	})
	if err != nil {
		t.Fatalf("InTx on a pool without fencekit_guard_try = %v, want it admitted", err)
	}
	if n, _ := counter(t, ctx, pool); n != 3 {
		t.Fatalf("n = %d, want 3", n)
	}
}

// countingConn counts the writes a client makes: each is one flight of
// messages, so in a request-response exchange it counts round trips.
type countingConn struct {
	net.Conn
	writes, reads *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) { c.writes.Add(1); return c.Conn.Write(p) }
func (c countingConn) Read(p []byte) (int, error)  { c.reads.Add(1); return c.Conn.Read(p) }

// The pipelined fenced write costs the same single flight of messages as a
// plain autocommit UPDATE once statements are cached.
func TestExecOneRoundTrip(t *testing.T) {
	ctx, pool := setup(t)
	var writes, reads atomic.Int64
	cfg := pool.Config().ConnConfig.Copy()
	dial := cfg.DialFunc
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countingConn{Conn: c, writes: &writes, reads: &reads}, nil
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)

	f := fenceOf("counter", 1, "h")
	fenced := func() error {
		_, err := postgres.Exec(ctx, conn, f, postgres.Statement{SQL: `UPDATE counter SET n = n + 1 WHERE id = $1`, Args: []any{1}})
		return err
	}
	plain := func() error {
		_, err := conn.Exec(ctx, `UPDATE counter SET n = n + 1 WHERE id = $1`, 1)
		return err
	}
	measure := func(name string, op func() error) int64 {
		if err := op(); err != nil { // warm the statement cache
			t.Fatalf("%s: %v", name, err)
		}
		w0, r0 := writes.Load(), reads.Load()
		if err := op(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		w, r := writes.Load()-w0, reads.Load()-r0
		t.Logf("%s: %d writes, %d reads", name, w, r)
		return w
	}
	fencedRead := func() error {
		return postgres.Query(ctx, conn, f, postgres.Statement{SQL: `SELECT n FROM counter WHERE id = $1`, Args: []any{1}},
			func(rows pgx.Rows) error { return nil })
	}
	wf, wp, wr := measure("fenced batch", fenced), measure("plain update", plain), measure("fenced read", fencedRead)
	if wf != 1 || wp != 1 || wr != 1 {
		t.Fatalf("fenced batch took %d flights, plain update %d, fenced read %d; want 1 each", wf, wp, wr)
	}
	if n, _ := counter(t, ctx, conn); n != 4 {
		t.Fatalf("n = %d, want 4", n)
	}
}

// A batch whose guard waits for a rival's row lock reports the rival's mark
// once the rival commits: the raising guard function re-reads under the lock.
func TestExecWaitsForWinnerAndReportsItsMark(t *testing.T) {
	ctx, pool := setup(t)
	raise(t, ctx, pool, fenceOf("counter", 2, "old"))
	winner := fenceOf("counter", 5, "winner")
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := postgres.Guard(ctx, tx, winner); err != nil {
		t.Fatal(err)
	}
	cl := acquire(t, ctx, pool)
	done := make(chan error, 1)
	go func() {
		_, err := postgres.Exec(ctx, cl, fenceOf("counter", 4, "loser"), postgres.Statement{SQL: `UPDATE counter SET n = 99 WHERE id = 1`})
		done <- err
	}()
	waitBlocked(t, ctx, pool, cl.Conn().PgConn().PID())
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	wantStale(t, <-done, winner)
	if n, _ := counter(t, ctx, pool); n != 0 {
		t.Fatalf("n = %d, the loser's statement committed", n)
	}
}

func TestQueryFencedRead(t *testing.T) {
	ctx, pool := setup(t)
	read := postgres.Statement{SQL: `SELECT n FROM counter WHERE id = $1`, Args: []any{1}}
	var n int64
	scan := func(rows pgx.Rows) error {
		for rows.Next() {
			if err := rows.Scan(&n); err != nil {
				return err
			}
		}
		return rows.Err()
	}
	mustExec(t, ctx, pool, `UPDATE counter SET n = 41 WHERE id = 1`)
	f := fenceOf("counter", 3, "a")
	if err := postgres.Query(ctx, pool, f, read, scan); err != nil {
		t.Fatal(err)
	}
	if n != 41 {
		t.Fatalf("read %d, want 41", n)
	}
	if got := mark(t, ctx, pool, "counter"); got != f {
		t.Fatalf("fenced read left mark %v, want %v", got, f)
	}
	called := false
	err := postgres.Query(ctx, pool, fenceOf("counter", 2, "b"), read, func(pgx.Rows) error { called = true; return nil })
	wantStale(t, err, f)
	if called {
		t.Fatal("fn called for a stale fenced read")
	}
	boom := errors.New("boom")
	if err := postgres.Query(ctx, pool, f, read, func(pgx.Rows) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("fn's error: got %v", err)
	}
	if err := postgres.Query(ctx, pool, f, read, nil); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("nil fn: %v", err)
	}
}

// The timeline of DESIGN.md section 3 with one-round-trip fenced reads
// (Query) and writes (Exec): A's write is refused, nothing is lost.
func TestTimelineOneRoundTripLosesNothing(t *testing.T) {
	ctx, pool := setup(t)
	tl := timeline{
		read: func(f fence.Fence) (n int64, err error) {
			err = postgres.Query(ctx, pool, f, postgres.Statement{SQL: `SELECT n FROM counter WHERE id = 1`}, func(rows pgx.Rows) error {
				_, err := pgx.ForEachRow(rows, []any{&n}, func() error { return nil })
				return err
			})
			return n, err
		},
		write: func(f fence.Fence, n int64) error {
			_, err := postgres.Exec(ctx, pool, f, postgres.Statement{
				SQL:  `UPDATE counter SET n = $1, writer = $2 WHERE id = 1`,
				Args: []any{n, int64(f.Token)},
			})
			return err
		},
	}
	acked, errA := tl.run(t)
	wantStale(t, errA, fenceOf("counter", 2, "B"))
	if n, writer := counter(t, ctx, pool); n != int64(acked) || writer != 2 {
		t.Fatalf("counter %d by token %d after %d acknowledged increments", n, writer, acked)
	}
}
