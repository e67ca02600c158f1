package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/election"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lock"
	"github.com/fencekit/fencekit/storage/postgres"
)

// SQL of the heartbeat: one row per election, and every beat kept in order
// (id), so that a write by a deposed leader shows as a token going back.
const (
	createHeartbeat = `CREATE TABLE IF NOT EXISTS leader_heartbeat (
	election text PRIMARY KEY, member text NOT NULL, token bigint NOT NULL, beats bigint NOT NULL)`
	createBeats = `CREATE TABLE IF NOT EXISTS leader_beats (
	id bigserial PRIMARY KEY, election text NOT NULL, member text NOT NULL, token bigint NOT NULL,
	at timestamptz NOT NULL DEFAULT clock_timestamp())`
	upsertHeartbeat = `INSERT INTO leader_heartbeat (election, member, token, beats) VALUES ($1, $2, $3, 1)
	ON CONFLICT (election) DO UPDATE SET member = $2, token = $3, beats = leader_heartbeat.beats + 1`
	insertBeat = `INSERT INTO leader_beats (election, member, token) VALUES ($1, $2, $3)`
)

// memberConfig is one candidate process.
type memberConfig struct {
	Name        string // the member's name, its election value
	Election    string
	PostgresURL string
	Redis       redis.Options
	LockPrefix  string
	TTL         time.Duration
	Beat        time.Duration
	Unfenced    bool
}

// Lines a member prints, one event each, which the parent parses.
const (
	lineLeads   = "%s: leads, term %d\n"
	lineFirst   = "%s: term %d: first heartbeat\n"
	lineLost    = "%s: term %d ended: %v\n"
	lineRefused = "%s: resumed: heartbeat of term %d refused as stale (lost to term %d)\n"
	lineWrote   = "%s: resumed: heartbeat of term %d written over term %d's\n"
	lineNoop    = "%s: resumed: heartbeat of term %d written (no newer leader had written)\n"
)

// runMember campaigns in the election and, while it leads, writes a
// heartbeat every Beat under its term's fence (without one, with
// Unfenced). A member resumed from SIGSTOP finishes the heartbeat it was
// writing when it stopped, with the fence of the term it had then: that
// late write is what storage refuses once a newer leader has written.
func runMember(ctx context.Context, cfg memberConfig, out io.Writer) error {
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
	defer stop()
	var mu sync.Mutex
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, format, args...)
	}
	pc, err := pgxpool.ParseConfig(cfg.PostgresURL)
	if err != nil {
		return err
	}
	// A leader stopped in the middle of a transaction holds its row locks,
	// and the next leader's heartbeat would wait for them as long as the
	// stop lasts: the server ends such a session after a TTL instead.
	pc.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = strconv.FormatInt(cfg.TTL.Milliseconds(), 10)
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return err
	}
	defer pool.Close()
	// Connect now, as a service would have: the first heartbeat of a term
	// should not wait for a new connection.
	if err := pool.Ping(ctx); err != nil {
		return err
	}
	client := redis.NewClient(&cfg.Redis)
	defer client.Close()
	locker, err := lock.New(client, lock.WithPrefix(cfg.LockPrefix))
	if err != nil {
		return err
	}
	defer locker.Close()
	e, err := election.New(locker, cfg.Election, election.WithTTL(cfg.TTL))
	if err != nil {
		return err
	}

	beat := func(ctx context.Context, f fence.Fence) error {
		write := func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, upsertHeartbeat, cfg.Election, cfg.Name, int64(f.Token)); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, insertBeat, cfg.Election, cfg.Name, int64(f.Token))
			return err
		}
		if cfg.Unfenced {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return write(ctx, tx) })
		}
		return postgres.InTx(ctx, pool, pgx.TxOptions{}, f, write)
	}

	// The term being written under, for the heartbeat a resumed member
	// finishes.
	var current atomic.Pointer[fence.Fence]
	cont := make(chan os.Signal, 1)
	signal.Notify(cont, syscall.SIGCONT)
	defer signal.Stop(cont)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-cont:
			}
			f := current.Load()
			if f == nil {
				continue
			}
			var newest int64
			_ = pool.QueryRow(ctx, `SELECT token FROM leader_heartbeat WHERE election = $1`, cfg.Election).Scan(&newest)
			err := beat(ctx, *f)
			switch {
			case errors.Is(err, fence.ErrStale):
				mark, _ := fence.LostTo(err)
				say(lineRefused, cfg.Name, f.Token, mark.Token)
			case err != nil:
				say("%s: resumed: heartbeat of term %d failed: %v\n", cfg.Name, f.Token, err)
			case fence.Token(newest) > f.Token:
				say(lineWrote, cfg.Name, f.Token, newest)
			default:
				say(lineNoop, cfg.Name, f.Token)
			}
		}
	}()

	err = election.Run(ctx, e, cfg.Name, func(ctx context.Context, f fence.Fence) error {
		current.Store(&f)
		say(lineLeads, cfg.Name, f.Token)
		tick := time.NewTicker(cfg.Beat)
		defer tick.Stop()
		for n := 0; ; n++ {
			if err := beat(ctx, f); err != nil {
				if ctx.Err() != nil {
					say(lineLost, cfg.Name, f.Token, context.Cause(ctx))
					return ctx.Err()
				}
				if errors.Is(err, fence.ErrStale) {
					// A newer leader has written: this term is over.
					say(lineLost, cfg.Name, f.Token, err)
					return nil
				}
				// A failed heartbeat (the server ended a session that a stop
				// left in a transaction, say) is tried again at the next beat.
				say("%s: term %d: heartbeat failed: %v\n", cfg.Name, f.Token, err)
				n--
			} else if n == 0 {
				say(lineFirst, cfg.Name, f.Token)
			}
			select {
			case <-ctx.Done():
				say(lineLost, cfg.Name, f.Token, context.Cause(ctx))
				return ctx.Err()
			case <-tick.C:
			}
		}
	})
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return nil
	}
	return err
}
