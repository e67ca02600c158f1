package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lock"
	"github.com/fencekit/fencekit/lock/pglock"
)

// releaseTimeout bounds the release at the end of an instance, which runs
// even when the run's context has ended.
const releaseTimeout = 2 * time.Second

// race is the state the instances of one run share. Nothing in it decides
// who draws: that is the lock's and storage's job. It only picks the
// instance to pause and tells it when the others are done.
type race struct {
	cfg Config
	db  store
	log *logger

	pauser     atomic.Bool
	done       atomic.Int32
	othersDone chan struct{}
	closeOnce  sync.Once
}

// finished counts an instance out; once all but the paused one are out,
// the paused one may resume.
func (r *race) finished() {
	if int(r.done.Add(1)) >= r.cfg.Instances-1 {
		r.closeOthers()
	}
}

func (r *race) closeOthers() { r.closeOnce.Do(func() { close(r.othersDone) }) }

// locker is an instance's own lock, as a separate process would have: a
// Redis client's, or (Lock "postgres") a pool's of the PostgreSQL
// database, or (Lock "mysql") a *sql.DB's of the MySQL database. done
// closes it.
func (r *race) locker(ctx context.Context) (l *lock.Locker, done func(), err error) {
	if r.cfg.Lock == lockMySQL {
		return mysqlLocker(r.cfg.MySQLDSN)
	}
	if r.cfg.Lock == lockPostgres {
		pool, err := pgxpool.New(ctx, r.cfg.PostgresURL)
		if err != nil {
			return nil, nil, err
		}
		l, err := pglock.New(pool)
		if err != nil {
			pool.Close()
			return nil, nil, err
		}
		return l, func() { l.Close(); pool.Close() }, nil
	}
	opt := r.cfg.Redis
	opt.ContextTimeoutEnabled = true // reads end at the context's deadline
	client := redis.NewClient(&opt)
	var opts []lock.Option
	if r.cfg.LockPrefix != "" {
		opts = append(opts, lock.WithPrefix(r.cfg.LockPrefix))
	}
	l, err = lock.New(client, opts...)
	if err != nil {
		client.Close()
		return nil, nil, err
	}
	return l, func() { l.Close(); client.Close() }, nil
}

// run is one instance: its own lock and connections, as a separate
// process would have.
func (r *race) run(ctx context.Context, id int) (Instance, error) {
	inst := Instance{ID: id}
	locker, closeLock, err := r.locker(ctx)
	if err != nil {
		return inst, err
	}
	defer closeLock()
	db, err := r.db.instance(ctx)
	if err != nil {
		return inst, err
	}
	defer db.close()

	day := r.cfg.Day.Format(dayLayout)
	resource := "lottery:" + day
	lease, err := locker.Acquire(ctx, resource, r.cfg.TTL)
	if err != nil {
		return inst, fmt.Errorf("instance %d: %w", id, err)
	}
	expires := time.Now().Add(r.cfg.TTL)
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer cancel()
		if err := lease.Release(rctx); errors.Is(err, lock.ErrNotHeld) {
			r.log.printf("instance %d (token %d): its lease had already expired", id, inst.Token)
		}
	}()
	f := lease.Fence()
	inst.Token, inst.Holder = f.Token, f.Holder
	pause := r.cfg.Pause && r.pauser.CompareAndSwap(false, true)
	who := fmt.Sprintf("instance %d (token %d)", id, f.Token)
	r.log.printf("%s: acquired %s", who, resource)

	rec, drawn, err := db.drawn(ctx, r.cfg)
	if err != nil {
		return inst, fmt.Errorf("instance %d: check: %w", id, err)
	}
	if drawn {
		return r.found(inst, who, rec), nil
	}
	r.log.printf("%s: no draw yet", who)

	if pause {
		inst.Paused = true
		// Sleep past the lease, then stay stopped until the others are done,
		// so that one of them takes over while this instance is away.
		d := time.Until(expires) + r.cfg.TTL/4
		r.log.printf("%s: pausing past its lease (%v) before drawing", who, r.cfg.TTL)
		time.Sleep(d)
		select {
		case <-r.othersDone:
		case <-ctx.Done():
			return inst, fmt.Errorf("instance %d: %w", id, ctx.Err())
		}
		r.log.printf("%s: resumes, still believing it holds the lock", who)
	}

	ran, chosen, err := db.draw(ctx, r.cfg, f)
	if errors.Is(err, fence.ErrOutcomeUnknown) && !r.cfg.Unfenced {
		// COMMIT's reply was lost: Once called again says whether the draw
		// committed, and draws only if it did not.
		r.log.printf("%s: the draw's outcome is unknown (%v); calling Once again", who, err)
		ran, chosen, err = db.draw(ctx, r.cfg, f)
	}
	if err != nil {
		return r.refused(inst, who, err)
	}
	if !ran {
		// The day was drawn between the check and Once: its record says by
		// which grant.
		if rec, drawn, err = db.drawn(ctx, r.cfg); err != nil {
			return inst, fmt.Errorf("instance %d: look up the draw: %w", id, err)
		}
		if !drawn {
			return inst, fmt.Errorf("instance %d: Once found the day drawn, yet it has no record", id)
		}
		return r.found(inst, who, rec), nil
	}
	inst.Outcome, inst.Chosen = Drew, chosen
	r.log.printf("%s: drew winners %v", who, chosen)
	return inst, nil
}

// found reports an instance that found the day drawn by the grant rec names.
func (r *race) found(inst Instance, who string, rec Record) Instance {
	inst.Outcome, inst.FoundBy = FoundExisting, rec.Token
	r.log.printf("%s: found the day drawn by token %d", who, rec.Token)
	return inst
}

// refused reports a stale fence as the normal end of an instance that a
// newer holder overtook: its work is dropped, never retried with a newer
// token. Any other error is returned.
func (r *race) refused(inst Instance, who string, err error) (Instance, error) {
	hw, ok := fence.LostTo(err)
	if !errors.Is(err, fence.ErrStale) || !ok {
		return inst, fmt.Errorf("instance %d: draw: %w", inst.ID, err)
	}
	inst.Outcome, inst.HighWater = RefusedStale, hw
	r.log.printf("%s: refused as stale: a newer holder (token %d) took over; it drew nothing", who, hw.Token)
	return inst, nil
}
