package pglock

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/fencekit/fencekit/lock"
)

// TestRecordOnlyByHolder: the record beside the lock is written only by
// the grant that holds the lock, never over a newer grant's record, read
// only while its writer holds the lock, and every write is notified.
func TestRecordOnlyByHolder(t *testing.T) {
	pool := migratedPool(t)
	b := testBackend(t, pool, config{})
	ctx := ctxFor(t, 30*time.Second)
	w := b.watchRecord("election")
	defer b.unwatch(w)

	g1, err := b.tryAcquire(ctx, "election", "h1", 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.setRecord(ctx, "election", "h2", g1.token, "intruder", time.Second); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("write by a non-holder = %v, want ErrNotHeld", err)
	}
	if err := b.setRecord(ctx, "election", "h1", g1.token, "leader-1", time.Second); err != nil {
		t.Fatal(err)
	}
	// A retried write changes nothing and succeeds.
	if err := b.setRecord(ctx, "election", "h1", g1.token, "leader-1", time.Second); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-w.c:
		if p != strconv.FormatInt(int64(g1.token), 10)+" leader-1" {
			t.Fatalf("notification %q, want token %d", p, g1.token)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no notification of the record's write")
	}
	rec, ok, err := b.record(ctx, "election")
	if err != nil || !ok || rec.value != "leader-1" || rec.token != g1.token || rec.holder != "h1" {
		t.Fatalf("record = %+v, %v, %v", rec, ok, err)
	}
	// Once the lease ends, nobody leads.
	time.Sleep(600 * time.Millisecond)
	if _, ok, err := b.record(ctx, "election"); err != nil || ok {
		t.Fatalf("record after the lease's end: ok=%v, %v", ok, err)
	}
	if err := b.setRecord(ctx, "election", "h1", g1.token, "late", time.Second); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("write after the lease's end = %v, want ErrNotHeld", err)
	}
	g2, err := b.tryAcquire(ctx, "election", "h2", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.setRecord(ctx, "election", "h2", g2.token, "leader-2", time.Second); err != nil {
		t.Fatal(err)
	}
	// A record of a newer token is never overwritten by an older grant,
	// even one that holds the lock again (the row's token says which).
	if _, err := pool.Exec(ctx, `UPDATE fencekit_lock SET record_token = record_token + 10 WHERE resource = 'election'`); err != nil {
		t.Fatal(err)
	}
	var newer *recordNewerError
	if err := b.setRecord(ctx, "election", "h2", g2.token, "older", time.Second); !errors.As(err, &newer) || newer.token != g2.token+10 {
		t.Fatalf("write under a newer record = %v, want recordNewerError naming %d", err, g2.token+10)
	}
}
