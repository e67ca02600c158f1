package pglock

import (
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/internal/lockbackend"
	"github.com/fencekit/fencekit/lock"
)

// New returns a [lock.Locker] whose leases and tokens are kept in pool's
// database: the same type as [lock.New]'s, so [lock.Locker.Do],
// [lock.Locker.Acquire], the election and every storage guard work with it
// unchanged. Every grant, release and extension is one statement, decided
// on the server's clock.
//
// The database needs migration 00006_fencekit_lock (run
// migrations.UpPool once); calls on a database without it return an error
// matching [ErrNotMigrated] that names the call. New returns without
// waiting on the server; in the background it reads the server's clock
// once (see the package doc on late grants), as the first grant would.
//
// opts are lock's options: [lock.WithTokenRetention] (how long the row of
// an idle resource outlives its last lease; reclaimed after that),
// [lock.WithWait] (poll on that strategy instead of waiting in the queue
// woken by NOTIFY: the choice behind PgBouncer in transaction mode, where
// LISTEN cannot work), and the telemetry providers. Options that mean
// nothing on PostgreSQL ([lock.WithPrefix], Redlock's node timeout) are
// refused with an error matching [fence.ErrInvalid].
//
// A Locker from New holds one connection of its own for LISTEN (opened
// as pool opens its own, with its BeforeConnect and AfterConnect, outside
// the pool) unless it polls; call
// [lock.Locker.Close] when done with it. It never closes pool.
func New(pool *pgxpool.Pool, opts ...lock.Option) (*lock.Locker, error) {
	return newWith(pool, nil, opts...)
}

// newWith is New with the grant and release statements sql (nil: the
// package's own).
func newWith(pool *pgxpool.Pool, sql *statements, opts ...lock.Option) (*lock.Locker, error) {
	return newWithConfig(pool, sql, nil, opts...)
}

// newWithConfig is newWith with edit (nil: none) applied to the backend's
// config: the tests' seams (a listener through a proxy, a control).
func newWithConfig(pool *pgxpool.Pool, sql *statements, edit func(*config), opts ...lock.Option) (*lock.Locker, error) {
	if pool == nil {
		return nil, invalid("New: nil *pgxpool.Pool")
	}
	if lockbackend.Open == nil {
		return nil, errors.New("pglock: New: this build of package lock opens no backends")
	}
	args := make([]any, len(opts))
	for i, o := range opts {
		args[i] = o
	}
	l, err := lockbackend.Open(func(s lockbackend.Settings) (lockbackend.Backend, error) {
		cfg := config{retention: s.Retention, poll: s.Poll, reclaim: reclaimEvery(s.Retention), sql: sql, meters: s.Meters}
		if edit != nil {
			edit(&cfg)
		}
		if err := checkConfig(cfg); err != nil {
			return nil, err
		}
		b, err := open(nil, s)
		if err != nil {
			return nil, err
		}
		b.backend = newBackend(pool, cfg)
		return b, nil
	}, args)
	if err != nil {
		return nil, err
	}
	locker, ok := l.(*lock.Locker)
	if !ok {
		return nil, fmt.Errorf("pglock: New: package lock returned a %T", l)
	}
	return locker, nil
}

// reclaimEvery is how often a Locker reclaims the rows of idle resources:
// a tenth of the retention, between one second and a minute.
func reclaimEvery(retention time.Duration) time.Duration {
	return min(max(retention/10, time.Second), time.Minute)
}

// checkConfig refuses settings the backend cannot keep.
func checkConfig(cfg config) error {
	if cfg.retention < 0 {
		return invalid("token retention %v is negative", cfg.retention)
	}
	return nil
}
