package integration

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	cirello "cirello.io/pglock"
	_ "github.com/jackc/pgx/v5/stdlib" // cirello's lock on database/sql
	_ "github.com/lib/pq"

	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock/pglock"
	"github.com/fencekit/fencekit/migrations"
)

// BenchmarkPglockPeer sets the PostgreSQL lock beside cirello.io/pglock (a
// lease table with a record version number, on database/sql) and the
// advisory-lock floor, uncontended: each iteration runs one grant and one
// release of each (fencekit's also on logged tables), in an order that turns, timing each, so that all three
// see the same load. It reports each one's median pair and its ratio to the
// floor (pg_try_advisory_lock + pg_advisory_unlock on one connection).
// cirello's lock lives here, in a test module, so that fencekit's go.mod
// never requires it.
//
//	cd internal/integration && go test -run '^$' -bench PglockPeer -benchtime 2000x -count 5 .
func BenchmarkPglockPeer(b *testing.B) {
	ctx := context.Background()
	const resource = "peer-bench"

	// The floor, on one connection of a pool of its own.
	floorConn, err := testenv.Postgres(b).Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer floorConn.Release()
	floor := func(ctx context.Context) error {
		var ok bool
		if err := floorConn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, int64(0x70656572)).Scan(&ok); err != nil || !ok {
			return fmt.Errorf("advisory lock: %v %v", ok, err)
		}
		if err := floorConn.QueryRow(ctx, `SELECT pg_advisory_unlock($1)`, int64(0x70656572)).Scan(&ok); err != nil || !ok {
			return fmt.Errorf("advisory unlock: %v %v", ok, err)
		}
		return nil
	}

	// fencekit's PostgreSQL lock, through its pool: on its UNLOGGED tables
	// (the choice) and on the same tables made logged, which pay a WAL
	// flush per grant and release as cirello's table does.
	fencekitLock := func(logged bool) func(context.Context) error {
		pool := testenv.Postgres(b)
		if err := migrations.UpPool(ctx, pool); err != nil {
			b.Fatal(err)
		}
		if logged {
			if _, err := pool.Exec(ctx, `ALTER TABLE fencekit_lock SET LOGGED; ALTER TABLE fencekit_lock_waiter SET LOGGED`); err != nil {
				b.Fatal(err)
			}
		}
		locker, err := pglock.New(pool)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(locker.Close)
		return func(ctx context.Context) error {
			lease, err := locker.TryAcquire(ctx, resource, 10*time.Second)
			if err != nil {
				return fmt.Errorf("fencekit: %w", err)
			}
			return lease.Release(ctx)
		}
	}
	fencekit, fencekitLogged := fencekitLock(false), fencekitLock(true)

	// cirello.io/pglock without heartbeats (a pair ends long before one
	// would be sent), on lib/pq (the driver its New accepts) and on pgx's
	// stdlib (through UnsafeNew), each on a database/sql pool of its own.
	peer := func(open func(string) (*sql.DB, error), newClient func(*sql.DB, ...cirello.ClientOption) (*cirello.Client, error)) func(context.Context) error {
		db, err := open(testenv.PostgresURL(b))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = db.Close() })
		client, err := newClient(db, cirello.WithLeaseDuration(10*time.Second), cirello.WithHeartbeatFrequency(0))
		if err != nil {
			b.Fatal(err)
		}
		if err := client.CreateTable(); err != nil {
			b.Fatal(err)
		}
		return func(ctx context.Context) error {
			l, err := client.AcquireContext(ctx, resource, cirello.FailIfLocked())
			if err != nil {
				return fmt.Errorf("cirello: %w", err)
			}
			return client.ReleaseContext(ctx, l)
		}
	}
	peerPQ := peer(func(u string) (*sql.DB, error) { return sql.Open("postgres", u) }, cirello.New)
	peerPgx := peer(func(u string) (*sql.DB, error) { return sql.Open("pgx", u) }, cirello.UnsafeNew)

	type contender struct {
		name string
		pair func(context.Context) error
		took []time.Duration
	}
	cs := []*contender{{name: "floor-conn", pair: floor}, {name: "fencekit", pair: fencekit}, {name: "fencekit-logged", pair: fencekitLogged}, {name: "cirello-libpq", pair: peerPQ}, {name: "cirello-pgx", pair: peerPgx}}
	for _, c := range cs { // one of each first, so that every statement is prepared
		if err := c.pair(ctx); err != nil {
			b.Fatal(err)
		}
	}
	i := 0
	for b.Loop() {
		for k := range cs {
			c := cs[(i+k)%len(cs)]
			start := time.Now()
			if err := c.pair(ctx); err != nil {
				b.Fatal(errors.Join(errors.New(c.name), err))
			}
			c.took = append(c.took, time.Since(start))
		}
		i++
	}
	median := func(d []time.Duration) float64 {
		s := slices.Clone(d)
		slices.Sort(s)
		return float64(s[len(s)/2].Nanoseconds()) / 1e3
	}
	f := median(cs[0].took)
	for _, c := range cs {
		m := median(c.took)
		b.ReportMetric(m, c.name+"-µs")
		if c != cs[0] {
			b.ReportMetric(m/f, c.name+"/floor-conn")
		}
	}
}
