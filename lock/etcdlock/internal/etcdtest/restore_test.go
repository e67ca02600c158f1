package etcdtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/internal/lockbackend"
	"github.com/fencekit/fencekit/lock/etcdlock/internal/backend"
	"github.com/fencekit/fencekit/migrations"
	"github.com/fencekit/fencekit/storage/postgres"
)

// restoreBump is the --bump-revision the tests restore with: far more
// revisions than the cluster issues between its backup and its restore
// here, as the operations guide asks (docs/operations.md).
const restoreBump = 1_000_000

// TestRestoreFromBackup restores a cluster from a snapshot taken
// mid-run, with etcdutl's restore, and judges what the holders of the
// run before the restore can still do. A holder granted after the backup
// (token T) pauses; the cluster is restored; another process is granted
// the same resource and writes through the PostgreSQL guard; then the
// paused holder's late write arrives.
//
//   - bumped: restored with --bump-revision and --mark-compacted, the new
//     grant's token is above T, and the late write is refused. The old
//     holder's process learns its grant is gone (the restored cluster has
//     no key of it) within a keep-alive interval and a round trip, and
//     Extend refuses.
//   - not-bumped (the operator step missed): a process that saw the old
//     revisions finds the cluster's revision went back, ends every belief
//     of its own and refuses to grant a token at or below one it saw. A
//     fresh process cannot know: its token is at or below T and the late
//     write is admitted on top of its write, which is why the operations
//     guide makes the bump a step of every restore.
func TestRestoreFromBackup(t *testing.T) {
	pool := testenv.Postgres(t)
	ctx := ctxFor(t, 2*time.Minute)
	if err := migrations.UpPool(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE restored (name text PRIMARY KEY, v text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	for _, bump := range []uint64{restoreBump, 0} {
		name := map[bool]string{true: "bumped", false: "not-bumped"}[bump != 0]
		t.Run(name, func(t *testing.T) {
			if _, err := pool.Exec(ctx, `INSERT INTO restored VALUES ($1, '')`, name); err != nil {
				t.Fatal(err)
			}
			write := func(f fence.Fence, v string) error {
				return postgres.InTx(ctx, pool, pgx.TxOptions{}, f, func(ctx context.Context, tx pgx.Tx) error {
					_, err := tx.Exec(ctx, `UPDATE restored SET v = $2 WHERE name = $1`, name, v)
					return err
				})
			}
			restoreRun(t, "r-"+name, bump, write)
		})
	}
}

func restoreRun(t *testing.T, res string, bump uint64, write func(f fence.Fence, v string) error) {
	c := StartCluster(t, 1)
	old := newBackend(t, c.Client(t))
	ctx := ctxFor(t, time.Minute)
	const ttl = 20 * time.Second
	// The old process's session lease is in the backup: the restored
	// cluster keeps it alive for that process's keep-alives.
	before := mustGrant(t, old, req("before", ttl))
	if err := old.Release(ctx, before.Hold); err != nil {
		t.Fatal(err)
	}
	path := c.Backup(t, 0)
	// The run goes on after the backup: 40 grants, then the holder that
	// will pause.
	for range 20 {
		o := mustGrant(t, old, req("after", ttl))
		if err := old.Release(ctx, o.Hold); err != nil {
			t.Fatal(err)
		}
	}
	r := req(res, ttl)
	grantedAt := time.Now()
	held := mustGrant(t, old, r)
	T := held.Token
	lost := held.Hold.(interface{ Lost() <-chan struct{} }).Lost()

	c.Restore(t, path, bump)
	c.Leader(t)
	ready := time.Now()

	// Another process, a client of the restored cluster.
	fresh := newBackendAt(t, c.ClientOf(t, c.Members[0].ClientURL()), old)
	var g lockbackend.Outcome
	for deadline := time.Now().Add(30 * time.Second); ; {
		var err error
		g, err = fresh.Try(ctxFor(t, 10*time.Second), req(res, ttl))
		if err == nil && g.Granted {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the restored cluster granted nothing: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	f2 := fence.Fence{Resource: res, Token: g.Token, Holder: g.Holder}
	if err := write(f2, "after the restore"); err != nil {
		t.Fatalf("the new holder's write: %v", err)
	}
	late := write(fence.Fence{Resource: res, Token: T, Holder: r.Holder}, "late")
	t.Logf("token %d before the restore, %d after; the late write: %v", T, g.Token, late)

	if bump == 0 {
		// The control: without the bump a restore takes tokens back.
		if g.Token > T {
			t.Fatalf("without --bump-revision the restored cluster issued %d above %d: the control shows nothing", g.Token, T)
		}
		if late != nil {
			t.Fatalf("without --bump-revision the late write was refused (%v): the control shows nothing", late)
		}
		// The old process saw the revisions the restore took back: it
		// grants nothing at or below them, and believes nothing of before.
		_, err := old.Try(ctxFor(t, 10*time.Second), req("y", ttl))
		if !errors.Is(err, backend.ErrRevisionWentBack) {
			t.Fatalf("the old process's try after a restore without the bump: %v, want ErrRevisionWentBack", err)
		}
	} else {
		if g.Token <= T {
			t.Fatalf("restored with --bump-revision %d, the cluster issued token %d, at or below %d issued before", bump, g.Token, T)
		}
		if !errors.Is(late, fence.ErrStale) {
			t.Fatalf("the old holder's late write after the restore: %v, want fence.ErrStale", late)
		}
	}
	// The old holder's belief ends within two keep-alive intervals
	// (ttl/5 each: the first may have been in flight during the restore)
	// and a round trip, before its own end (ttl after its grant).
	bound := min(2*ttl/5+2*time.Second, time.Until(grantedAt.Add(ttl)))
	select {
	case <-lost:
		t.Logf("the old process learned its grant was gone %v after the restored cluster had a leader", time.Since(ready).Round(time.Millisecond))
	case <-time.After(time.Until(ready.Add(bound))):
		t.Fatalf("the old holder still believed %v after the restored cluster had a leader", time.Since(ready).Round(time.Millisecond))
	}
	if _, err := old.Extend(ctx, held.Hold, ttl); !errors.Is(err, lockbackend.ErrNotHeld) {
		t.Fatalf("the old holder's Extend after the restore: %v, want ErrNotHeld", err)
	}
}
