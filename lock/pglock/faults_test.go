package pglock

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/migrations"
)

// TestLostGrantReplyIsRetriedOrReleased: a grant whose reply is lost
// (the connection cut after the server ran it) is sent again on another
// connection, and the retry, with the same holder id, returns the same
// grant; a TryAcquire whose reply is lost and whose retries fail too
// reports an error and releases what it may have taken, so no lock is
// left that nobody knows about.
func TestLostGrantReplyIsRetriedOrReleased(t *testing.T) {
	base := migratedPool(t)
	proxy := testenv.StartProxy(t, hostPort(t, base))
	pool := poolAt(t, base, "postgres://postgres@"+proxy.Addr()+"/test?sslmode=disable", map[string]string{"pool_max_conns": "1"})
	b := testBackend(t, pool, config{poll: true})
	ctx := ctxFor(t, 30*time.Second)
	// Warm the one connection with the statement (pgx prepares it in a
	// round trip of its own), so the lost bytes are the grant's reply.
	warm := func() {
		t.Helper()
		if _, _, err := b.try(ctx, "Acquire", "warm", "hw", time.Millisecond, 0, true); err != nil {
			t.Fatal(err)
		}
	}
	warm()

	var ranFirst int64
	proxy.LoseNextReply(func() {
		// The server ran the grant; the client has not seen its reply.
		if err := base.QueryRow(ctx, `SELECT token FROM fencekit_lock WHERE resource = 'r'`).Scan(&ranFirst); err != nil {
			t.Errorf("the lost grant did not reach the server: %v", err)
		}
	})
	g, _, err := b.try(ctx, "Acquire", "r", "h1", time.Minute, 0, true)
	if proxy.Faults().Lost != 1 {
		t.Fatalf("faults %+v: no reply was lost", proxy.Faults())
	}
	if err != nil || g == nil || int64(g.token) != ranFirst || !g.retried {
		t.Fatalf("try with its reply lost = %+v, %v; want the grant its first run made (token %d), found again", g, err, ranFirst)
	}
	if held, err := b.release(ctx, "r", "h1"); err != nil || !held {
		t.Fatalf("release = %v, %v", held, err)
	}

	// TryAcquire: the reply is lost and every retry fails (the server
	// refuses connections for a while), the caller gets an error that
	// says the grant may have run, and the lock it took is released in
	// the background.
	warm()
	proxy.LoseNextReply(func() { proxy.CutFor(time.Second) })
	_, err = b.tryAcquire(ctx, "r", "h2", time.Minute)
	if err == nil || !mayHaveRun(err) {
		t.Fatalf("TryAcquire with its reply lost and its retries refused = %v, want an error that may have run", err)
	}
	eventually(t, 10*time.Second, "the lost grant released", func() bool {
		var holder *string
		err := base.QueryRow(ctx, `SELECT holder FROM fencekit_lock WHERE resource = 'r'`).Scan(&holder)
		return err == nil && holder == nil
	})
	if proxy.Faults().Lost != 2 {
		t.Fatalf("faults %+v: the second reply was not lost", proxy.Faults())
	}
}

func hostPort(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	c := pool.Config().ConnConfig
	return c.Host + ":" + strconv.Itoa(int(c.Port))
}

// TestTerminatedConnections: pg_terminate_backend of every connection of
// the lock (the pool's and the listener's) loses no grant: the lock is
// still held, its holder releases it, and a waiter is still woken once
// the listener has connected again.
func TestTerminatedConnections(t *testing.T) {
	base := migratedPool(t)
	app := "fencekit_pglock_" + fence.NewHolder()[:12]
	pool := poolAt(t, base, base.Config().ConnString(), map[string]string{"application_name": app})
	b := testBackend(t, pool, config{})
	ctx := ctxFor(t, 60*time.Second)
	g, err := b.tryAcquire(ctx, "r", "h1", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	terminate := func() int {
		var n int
		err := base.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := terminate(); n < 2 {
		t.Fatalf("terminated %d connections, want the pool's and the listener's", n)
	}
	// The first call on a terminated connection may fail; pgx drops it.
	// (A raw try: TryAcquire would release whatever a failed call of the
	// same holder id may have taken, and a Lease never reuses one.)
	var again *grant
	for range 3 {
		again, _, err = b.try(ctx, "Acquire", "r", "h1", time.Hour, 0, true)
		if err == nil {
			break
		}
	}
	if err != nil || again.token != g.token {
		t.Fatalf("after the terminations the grant is %+v, %v; want token %d", again, err, g.token)
	}
	got := make(chan error, 1)
	waiter, err := New(pool)
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Close()
	go func() { _, err := waiter.Acquire(ctx, "r", time.Second); got <- err }()
	eventually(t, 10*time.Second, "waiter queued", func() bool { return waiters(t, base, "r") == 1 })
	eventually(t, 10*time.Second, "listener back", b.listen.up)
	terminate()
	eventually(t, 10*time.Second, "listener back", b.listen.up)
	var held bool
	for range 3 {
		held, err = b.release(ctx, "r", "h1")
		if err == nil {
			break
		}
	}
	if err != nil || !held {
		t.Fatalf("release after the terminations = %v, %v", held, err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the waiter was not granted the lock")
	}
}

// TestTokensAcrossCrash: a private server crashes (immediate stop, crash
// recovery empties the UNLOGGED tables); the lock is free after it, and
// the next token, from the clock, is above every token issued before.
// A clean restart keeps the rows.
func TestTokensAcrossCrash(t *testing.T) {
	srv := testenv.StartPostgres(t)
	pool := srv.Pool()
	ctx := ctxFor(t, 120*time.Second)
	if err := migrations.UpPool(ctx, pool); err != nil {
		t.Fatal(err)
	}
	b := testBackend(t, pool, config{})
	g1, err := b.tryAcquire(ctx, "r", "h1", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	srv.Restart()
	pool.Reset()
	if _, ok := rowOf(t, pool, "r"); !ok {
		t.Fatal("a clean restart lost the lock's row")
	}
	g2, err := b.tryAcquire(ctx, "r", "h1", time.Hour)
	if err != nil || g2.token != g1.token {
		t.Fatalf("after a clean restart: %+v, %v; want the grant kept", g2, err)
	}
	srv.Crash()
	pool.Reset()
	if _, ok := rowOf(t, pool, "r"); ok {
		t.Fatal("the UNLOGGED row survived a crash")
	}
	g3, err := b.tryAcquire(ctx, "r", "h2", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if g3.token <= g1.token || !g3.fromClock {
		t.Fatalf("after the crash: %+v; want a token from the clock above %d", g3, g1.token)
	}
	eventually(t, 20*time.Second, "listener back", b.listen.up)
}

// TestDeadlinesAndCloseOnASilentServer: with the network to the server
// black-holed, TryAcquire returns by its context's deadline with an error
// matching it, and Close returns within its bound.
func TestDeadlinesAndCloseOnASilentServer(t *testing.T) {
	base := migratedPool(t)
	proxy := testenv.StartProxy(t, hostPort(t, base))
	pool := poolAt(t, base, "postgres://postgres@"+proxy.Addr()+"/test?sslmode=disable", nil)
	l, err := New(pool)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t, 30*time.Second)
	if ls, err := l.TryAcquire(ctx, "r", time.Minute); err != nil {
		t.Fatal(err)
	} else if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	proxy.Block()
	defer proxy.Unblock()
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = l.TryAcquire(short, "r", time.Minute)
	took := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("TryAcquire on a silent server = %v, want context.DeadlineExceeded", err)
	}
	// Generous for a loaded machine; without the deadline it would wait
	// for TCP to give up, minutes.
	if took > 3*time.Second {
		t.Fatalf("TryAcquire returned %v after its 300ms deadline", took)
	}
	start = time.Now()
	l.Close()
	if d := time.Since(start); d > 6*time.Second {
		t.Fatalf("Close took %v on a silent server", d)
	}
	t.Logf("TryAcquire returned after %v, Close after %v", took, time.Since(start))
}
