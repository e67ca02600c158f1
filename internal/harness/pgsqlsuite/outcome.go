package pgsqlsuite

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/storage/pgsql"
)

func init() {
	register(
		test{"CommitInFlightWhenContextEnds", testCommitInFlightCtx},
		test{"CommitReplyLost", testCommitReplyLost},
		test{"ContextEndsBeforeCommit", testContextEndsBeforeCommit},
		test{"RefusedCommitIsKnown", testRefusedCommitIsKnown},
		test{"AutocommitReplyLost", testAutocommitReplyLost},
		test{"FunctionCommitsItself", testFunctionCommitsItself},
	)
}

// testFunctionCommitsItself: a function that commits InTx's transaction
// itself leaves InTx nothing to commit, and InTx cannot know what that
// commit did: an unknown outcome, never a claim that nothing applied (here
// the write did).
func testFunctionCommitsItself(t *testing.T, d Driver) {
	e := setup(t, d)
	err := pgsql.InTx(e.ctx, e.db, nil, fenceOf("r", 1, "h"), func(ctx context.Context, tx *sql.Tx) error {
		if err := increment(ctx, tx); err != nil {
			return err
		}
		return tx.Commit()
	})
	if !errors.Is(err, fence.ErrOutcomeUnknown) {
		t.Fatalf("InTx = %v, want an unknown outcome", err)
	}
	if n := e.counter(); n != 1 {
		t.Fatalf("counter = %d, want 1 (the function's own commit)", n)
	}
}

// proxied returns a database reached through a fault proxy, on e's schema.
func (e *env) proxied() (*sql.DB, *testenv.Proxy) {
	e.t.Helper()
	p := testenv.StartProxy(e.t, hostOf(e.t, e.url))
	db := open(e.t, e.d, e.via(p.Addr()))
	db.SetMaxIdleConns(1)
	db.SetMaxOpenConns(1)
	return db, p
}

func hostOf(t *testing.T, u string) string {
	t.Helper()
	rest := u[strings.Index(u, "@")+1:]
	return rest[:strings.IndexAny(rest, "/?")]
}

// testCommitInFlightCtx blocks the network once fn's write is acknowledged,
// so the COMMIT is sent but unanswered when InTx's context ends: InTx must
// return ErrOutcomeUnknown (with the context's error as its cause) at once,
// not a rollback.
func testCommitInFlightCtx(t *testing.T, d Driver) {
	e := setup(t, d)
	db, p := e.proxied()
	callCtx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	err := pgsql.InTx(callCtx, db, nil, fenceOf("r", 1, "h"), func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `UPDATE counter SET n = n + 1 WHERE id = 1`); err != nil {
			return err
		}
		p.Block()
		// The context ends once the COMMIT is on its way: a second is
		// plenty for InTx to send it, however loaded the machine.
		time.AfterFunc(time.Second, cancel)
		return nil
	})
	if !errors.Is(err, fence.ErrOutcomeUnknown) || !errors.Is(err, context.Canceled) {
		t.Fatalf("InTx = %v, want ErrOutcomeUnknown caused by the ended context", err)
	}
	if n := e.counter(); n != 0 {
		t.Fatalf("counter = %d while the COMMIT is held, want 0", n)
	}
	p.Unblock()
	// Whether the held COMMIT lands now depends on whether the driver
	// closed its connection when the context ended; either is an outcome
	// InTx could not know.
	time.Sleep(500 * time.Millisecond)
	t.Logf("%s: %v; counter after the network healed: %d", d.Name, err, e.counter())
}

// testCommitReplyLost drops the server's answer to COMMIT and cuts the
// connection: the write is applied, and InTx returns ErrOutcomeUnknown. The
// log says what the driver reported.
func testCommitReplyLost(t *testing.T, d Driver) {
	e := setup(t, d)
	db, p := e.proxied()
	err := pgsql.InTx(e.ctx, db, nil, fenceOf("r", 1, "h"), func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `UPDATE counter SET n = n + 1 WHERE id = 1`); err != nil {
			return err
		}
		p.LoseNextReply(nil)
		return nil
	})
	var ue *fence.OutcomeUnknownError
	if !errors.As(err, &ue) {
		t.Fatalf("InTx = %v, want ErrOutcomeUnknown", err)
	}
	t.Logf("%s reports a connection broken mid-COMMIT as %T: %v", d.Name, ue.Err, ue.Err)
	e.waitCounter(1)
	if p.Faults().Lost != 1 {
		t.Fatalf("the proxy lost %d replies, want 1", p.Faults().Lost)
	}
}

// testContextEndsBeforeCommit cancels the context inside fn: the COMMIT is
// never sent, the transaction is rolled back, and the error is the
// context's, not an unknown outcome.
func testContextEndsBeforeCommit(t *testing.T, d Driver) {
	e := setup(t, d)
	callCtx, cancel := context.WithCancel(e.ctx)
	err := pgsql.InTx(callCtx, e.db, nil, fenceOf("r", 1, "h"), func(ctx context.Context, tx *sql.Tx) error {
		if err := increment(ctx, tx); err != nil {
			return err
		}
		cancel()
		return nil
	})
	if !errors.Is(err, context.Canceled) || errors.Is(err, fence.ErrOutcomeUnknown) {
		t.Fatalf("InTx = %v, want context.Canceled and a known outcome", err)
	}
	if n := e.counter(); n != 0 {
		t.Fatalf("counter = %d, want 0", n)
	}
	if m := e.mark("r"); m.Token != 0 {
		t.Fatalf("mark = %v, want none", m)
	}
}

// testRefusedCommitIsKnown: a COMMIT the server refuses (a deferred unique
// constraint) committed nothing, and InTx says so: the server's error, not
// an unknown outcome.
func testRefusedCommitIsKnown(t *testing.T, d Driver) {
	e := setup(t, d)
	e.exec(`CREATE TABLE uniq (v int, CONSTRAINT uniq_v UNIQUE (v) DEFERRABLE INITIALLY DEFERRED)`)
	err := pgsql.InTx(e.ctx, e.db, nil, fenceOf("r", 1, "h"), func(ctx context.Context, tx *sql.Tx) error {
		if err := increment(ctx, tx); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO uniq (v) VALUES (1), (1)`)
		return err
	})
	if err == nil || errors.Is(err, fence.ErrOutcomeUnknown) || !strings.Contains(err.Error(), "23505") && !strings.Contains(err.Error(), "uniq_v") {
		t.Fatalf("InTx = %v, want the server's refusal of COMMIT, a known outcome", err)
	}
	if n := e.counter(); n != 0 {
		t.Fatalf("counter = %d, want 0", n)
	}
}

// testAutocommitReplyLost drops the reply to a Table.Update on a *sql.DB,
// which commits by itself: the call must report an unknown outcome, and
// the write was applied. Losing the server's first bytes on a new
// connection instead fails the connection before the statement is sent:
// that is a plain error, and nothing is written.
func testAutocommitReplyLost(t *testing.T, d Driver) {
	e, tbl := accounts(t, d)
	db, p := e.proxied()
	p.LoseNextReply(nil) // the handshake's reply: the statement is never sent
	err := tbl.Update(e.ctx, db, fenceOf("acct", 1, "h"), "a", pgsql.Set("balance", 41))
	if err == nil || errors.Is(err, fence.ErrOutcomeUnknown) {
		t.Fatalf("Update on a connection that never opened = %v, want a plain error", err)
	}
	if bal, _ := e.balance("a"); bal != 10 {
		t.Fatalf("balance = %d, want 10", bal)
	}
	// A write that succeeds opens the connection; the ping then reuses it,
	// and pgx's stdlib, which pings a reused connection first unless it was
	// reset within the last second, marks it fresh.
	if err := tbl.Update(e.ctx, db, fenceOf("acct", 1, "h"), "a", pgsql.Set("balance", 41)); err != nil {
		t.Fatal(err)
	}
	if err := db.PingContext(e.ctx); err != nil {
		t.Fatal(err)
	}
	p.LoseNextReply(nil) // now the statement's
	err = tbl.Update(e.ctx, db, fenceOf("acct", 1, "h"), "a", pgsql.Set("balance", 42))
	if !errors.Is(err, fence.ErrOutcomeUnknown) {
		t.Fatalf("Update with its reply lost = %v, want ErrOutcomeUnknown", err)
	}
	// pgx sends the statement in one message, so the lost reply is its
	// answer and the write was applied; lib/pq sends a statement with
	// arguments in two round trips, and the lost reply is the first's, so
	// the write never ran. Neither driver's error tells which.
	bal, _ := e.balance("a")
	t.Logf("%s: Table.Update with its reply lost: %v (balance %d)", d.Name, err, bal)
	if bal != 41 && bal != 42 {
		t.Fatalf("balance = %d, want 41 or 42", bal)
	}
}
