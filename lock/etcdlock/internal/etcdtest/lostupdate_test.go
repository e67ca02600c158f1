package etcdtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/internal/lockbackend"
	"github.com/fencekit/fencekit/lock/etcdlock/internal/backend"
	"github.com/fencekit/fencekit/migrations"
	"github.com/fencekit/fencekit/storage/postgres"
)

// tally is what one arm of the lost-update proof saw.
type tally struct {
	acked, refused, pauses int64
	final                  int64
}

// TestLostUpdatesEtcdLockWithPostgresGuard runs the lost-update workload
// (acquire, read, sometimes pause past the lease, write, release) with
// etcd locks on a three-member cluster, twice in the same run: with the
// PostgreSQL guard admitting each read and write by the grant's fence, no
// acknowledged increment is lost; with the plain lock alone (the negative
// control), the paused holders' late writes lose some.
func TestLostUpdatesEtcdLockWithPostgresGuard(t *testing.T) {
	c := StartCluster(t, 3)
	b := newBackend(t, c.Client(t))
	pool := testenv.Postgres(t)
	ctx := ctxFor(t, 2*time.Minute)
	if err := migrations.UpPool(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE counter (name text PRIMARY KEY, v bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	fenced := lostUpdateRun(t, b, pool, "fenced", true)
	plain := lostUpdateRun(t, b, pool, "plain", false)
	t.Logf("fenced: %d acknowledged, %d refused as stale, %d pauses, final %d: %d lost",
		fenced.acked, fenced.refused, fenced.pauses, fenced.final, fenced.acked-fenced.final)
	t.Logf("plain:  %d acknowledged, %d pauses, final %d: %d lost",
		plain.acked, plain.pauses, plain.final, plain.acked-plain.final)
	if fenced.acked < 10 || fenced.pauses < 2 || plain.pauses < 2 {
		t.Fatalf("the run judged too little: fenced %+v, plain %+v", fenced, plain)
	}
	if fenced.final != fenced.acked {
		t.Errorf("fenced: %d acknowledged increments, final value %d: %d lost", fenced.acked, fenced.final, fenced.acked-fenced.final)
	}
	if fenced.refused == 0 {
		t.Errorf("fenced: no late write was refused, so the pauses tested nothing")
	}
	if plain.final >= plain.acked {
		t.Errorf("negative control: the plain lock lost nothing (%d acknowledged, final %d): the workload cannot show a loss", plain.acked, plain.final)
	}
}

func lostUpdateRun(t *testing.T, b *backend.Backend, pool *pgxpool.Pool, name string, guard bool) tally {
	t.Helper()
	ctx := ctxFor(t, time.Minute)
	if _, err := pool.Exec(ctx, `INSERT INTO counter VALUES ($1, 0)`, name); err != nil {
		t.Fatal(err)
	}
	resource := "lost-" + name
	var tl tally
	// The run lasts 8s, longer on a loaded machine until it has judged
	// enough (3 pauses, 10 acknowledged writes), and 45s at most.
	start := time.Now()
	more := func() bool {
		d := time.Since(start)
		enough := atomic.LoadInt64(&tl.pauses) >= 3 && atomic.LoadInt64(&tl.acked) >= 10
		return d < 8*time.Second || (!enough && d < 45*time.Second)
	}
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Go(func() {
			for i := 0; more(); i++ {
				r := req(resource, 2*time.Second)
				out, err := b.Try(ctx, r)
				if err != nil || !out.Granted {
					time.Sleep(20 * time.Millisecond)
					continue
				}
				f := fence.Fence{Resource: resource, Token: out.Token, Holder: r.Holder}
				var v int64
				read := func(ctx context.Context, q interface {
					QueryRow(context.Context, string, ...any) pgx.Row
				}) error {
					return q.QueryRow(ctx, `SELECT v FROM counter WHERE name = $1`, name).Scan(&v)
				}
				write := func(ctx context.Context, tx pgx.Tx) error {
					_, err := tx.Exec(ctx, `UPDATE counter SET v = $2 WHERE name = $1`, name, v+1)
					return err
				}
				if guard {
					err = postgres.InTx(ctx, pool, pgx.TxOptions{}, f, func(ctx context.Context, tx pgx.Tx) error { return read(ctx, tx) })
				} else {
					err = read(ctx, pool)
				}
				if err != nil {
					if errors.Is(err, fence.ErrStale) {
						atomic.AddInt64(&tl.refused, 1)
						continue
					}
					t.Errorf("%s read: %v", name, err)
					return
				}
				if w == 0 && i%2 == 1 {
					// A pause past the lease (GC, swap, a slow network):
					// the server expires the lease, another holder goes on.
					atomic.AddInt64(&tl.pauses, 1)
					time.Sleep(3 * time.Second)
				}
				if guard {
					err = postgres.InTx(ctx, pool, pgx.TxOptions{}, f, write)
				} else {
					err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return write(ctx, tx) })
				}
				switch {
				case err == nil:
					atomic.AddInt64(&tl.acked, 1)
				case errors.Is(err, fence.ErrStale):
					atomic.AddInt64(&tl.refused, 1)
				default:
					t.Errorf("%s write: %v", name, err)
					return
				}
				if err := b.Release(ctx, out.Hold); err != nil && !errors.Is(err, lockbackend.ErrNotHeld) {
					t.Errorf("%s release: %v", name, err)
				}
			}
		})
	}
	wg.Wait()
	if err := pool.QueryRow(ctx, `SELECT v FROM counter WHERE name = $1`, name).Scan(&tl.final); err != nil {
		t.Fatal(fmt.Errorf("final read: %w", err))
	}
	return tl
}
