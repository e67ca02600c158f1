package mysqllock

import (
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/fencekit/fencekit/internal/lockbackend"
	"github.com/fencekit/fencekit/lock"
)

// New returns a [lock.Locker] whose leases and tokens are kept in db's
// database, MySQL 8 or MariaDB 10.6 and later, opened with
// github.com/go-sql-driver/mysql: the same type as [lock.New]'s, so
// [lock.Locker.Do], [lock.Locker.Acquire], the election and every storage
// guard work with it unchanged. Every grant, release and extension is one
// statement (a CALL), decided on the server's clock, with a token above
// every earlier one of the resource.
//
// The database needs migrations 00005_fencekit_lock and
// 00006_fencekit_lock_grant_until of migrations.MySQLFS (run
// migrations.UpMySQL once); calls on a database without them return an
// error matching [ErrNotMigrated] that names the call. New itself sends
// nothing.
//
// opts are lock's options: [lock.WithTokenRetention] (how long the row of
// an idle resource outlives its last lease; reclaimed after that),
// [lock.WithWait] (poll on that strategy instead of waiting in the queue,
// woken by the doorbell), and the telemetry providers. Options that mean
// nothing on MySQL ([lock.WithPrefix], Redlock's node timeout) are refused
// with an error matching [lock.ErrUnsupported] (and [fence.ErrInvalid]).
//
// While it has waiters, a Locker from New takes one connection out of
// db's pool for its doorbell (see the package doc), so db must allow two
// or more unless the Locker polls (lock.WithWait); call
// [lock.Locker.Close] when done with it. It never closes db.
func New(db *sql.DB, opts ...lock.Option) (*lock.Locker, error) {
	return newWith(db, config{}, opts...)
}

// newWith is New with the test hooks of extra.
func newWith(db *sql.DB, extra config, opts ...lock.Option) (*lock.Locker, error) {
	if db == nil {
		return nil, invalid("New: nil *sql.DB")
	}
	if lockbackend.Open == nil {
		return nil, errors.New("mysqllock: New: this build of package lock opens no backends")
	}
	args := make([]any, len(opts))
	for i, o := range opts {
		args[i] = o
	}
	l, err := lockbackend.Open(func(s lockbackend.Settings) (lockbackend.Backend, error) {
		switch {
		case s.Given&lockbackend.GivenPrefix != 0:
			return nil, fmt.Errorf("%w: mysqllock: New: lock.WithPrefix names Redis keys; a MySQL lock keeps its rows in the fencekit_lock table", lockbackend.ErrUnsupported)
		case s.Given&lockbackend.GivenNodeTimeout != 0:
			return nil, fmt.Errorf("%w: mysqllock: New: a node timeout is Redlock's; a MySQL lock has one server, bounded by each call's context", lockbackend.ErrUnsupported)
		case s.Retention < 0:
			return nil, invalid("token retention %v is negative", s.Retention)
		case !s.Poll && db.Stats().MaxOpenConnections == 1:
			// The doorbell would hold the only connection while a waiter
			// waits, and every other call would wait for it.
			return nil, invalid("a *sql.DB limited to one connection: a waiting Locker's doorbell takes one; allow two or more, or give lock.WithWait")
		}
		cfg := extra
		cfg.retention, cfg.poll, cfg.reclaim = s.Retention, s.Poll, reclaimEvery(s.Retention)
		return newBackend(db, cfg, s.Background), nil
	}, args)
	if err != nil {
		return nil, err
	}
	locker, ok := l.(*lock.Locker)
	if !ok {
		return nil, fmt.Errorf("mysqllock: New: package lock returned a %T", l)
	}
	return locker, nil
}

// reclaimEvery is how often a Locker reclaims the rows of idle resources:
// a tenth of the retention, between one second and a minute.
func reclaimEvery(retention time.Duration) time.Duration {
	return min(max(retention/10, time.Second), time.Minute)
}
