// Package suite measures fencekit against the Redis locks users would pick
// instead (bsm/redislock, go-redsync/redsync, rueidislock) and against the
// floor of plain commands, on private Redis servers and a PostgreSQL schema
// of its own, with the contenders interleaved so that they share the load.
package suite

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strconv"
	"time"
)

// Config sizes a run.
type Config struct {
	UncontendedOps int           // operations per contender and goroutine
	Parallel       int           // goroutines of the parallel uncontended runs
	CostOps        int           // operations of the allocation and server-cost pass
	HandoffWarm    time.Duration // before each hand-off window
	HandoffWindow  time.Duration // measured, per hand-off run
	HandoffReps    int           // runs of each hand-off case; the report takes the median
	Waiters        []int
	Lockers        []int
	StorageOps     int
	PostgresURL    string    `json:"-"` // "" skips the PostgreSQL comparison
	Log            io.Writer `json:"-"`
}

// Full is the configuration of the committed report.
func Full() Config {
	return Config{UncontendedOps: 4000, Parallel: 8, CostOps: 3000, HandoffWarm: 300 * time.Millisecond,
		HandoffWindow: 2 * time.Second, HandoffReps: 3, Waiters: []int{2, 8, 32, 128}, Lockers: []int{1, 4},
		StorageOps: 5000}
}

// Quick is a run of seconds that exercises every part.
func Quick() Config {
	return Config{UncontendedOps: 300, Parallel: 4, CostOps: 300, HandoffWarm: 50 * time.Millisecond,
		HandoffWindow: 250 * time.Millisecond, HandoffReps: 1, Waiters: []int{2, 8, 32, 128}, Lockers: []int{1, 4},
		StorageOps: 300}
}

// Uncontenders are the contenders of the uncontended runs, in report order.
var Uncontenders = []string{Fencekit, Redislock, Redsync, Rueidislock, Floor, FloorLua, FloorToken}

// Handoffers are the contenders of the hand-off runs, in report order.
var Handoffers = []string{Fencekit, FencekitPolling, Redislock, Redsync, Rueidislock}

// Results is everything one run measured.
type Results struct {
	Config      Config
	Started     time.Time
	Took        time.Duration
	RTT         time.Duration
	Redis       string // the server's version
	Uncontended []Uncontended
	Costs       map[string]Cost
	Handoffs    []Handoff // the median run of each case
	Storage     []Pair
}

// Run measures everything cfg asks for.
func Run(ctx context.Context, cfg Config) (*Results, error) {
	logf := func(format string, args ...any) {
		if cfg.Log != nil {
			fmt.Fprintf(cfg.Log, format+"\n", args...)
		}
	}
	r := &Results{Config: cfg, Started: time.Now(), Costs: map[string]Cost{}}
	srv, err := StartServer(ctx)
	if err != nil {
		return nil, err
	}
	defer srv.Stop()
	if r.RTT, err = srv.RTT(ctx, 500); err != nil {
		return nil, err
	}
	if r.Redis, err = srv.Version(ctx); err != nil {
		return nil, err
	}

	// Uncontended: one Locker (one client) per contender, shared by the
	// goroutines of a run.
	lockers := map[string]Locker{}
	defer func() {
		for _, l := range lockers {
			l.Close()
		}
	}()
	for _, name := range Uncontenders {
		if lockers[name], err = NewLocker(name, srv.Addr, "u:"); err != nil {
			return nil, err
		}
	}
	for i, c := range []struct {
		parallel int
		fresh    bool
	}{{1, true}, {1, false}, {cfg.Parallel, true}, {cfg.Parallel, false}} {
		logf("uncontended: %d goroutine(s), fresh=%v", c.parallel, c.fresh)
		u, err := RunUncontended(ctx, lockers, Uncontenders, c.parallel, cfg.UncontendedOps, c.fresh, "r"+strconv.Itoa(i))
		if err != nil {
			return nil, err
		}
		r.Uncontended = append(r.Uncontended, u)
	}
	for _, name := range Uncontenders {
		logf("cost: %s", name)
		if r.Costs[name], err = MeasureCost(ctx, name, lockers[name], srv, cfg.CostOps, "cost"); err != nil {
			return nil, err
		}
	}

	// Hand-off: each case repeated, the repetitions of all contenders
	// interleaved, and a fresh set of Lockers (and clients) for each run.
	type key struct {
		name             string
		waiters, lockers int
	}
	runs := map[key][]Handoff{}
	seq := 0
	for rep := range cfg.HandoffReps {
		for _, lk := range cfg.Lockers {
			for _, w := range cfg.Waiters {
				for k := range Handoffers {
					name := Handoffers[(k+rep)%len(Handoffers)]
					seq++
					h, err := RunHandoff(ctx, srv, name, w, lk, cfg.HandoffWarm, cfg.HandoffWindow, "h"+strconv.Itoa(seq)+":")
					if err != nil {
						return nil, err
					}
					logf("handoff: %-16s waiters=%-3d lockers=%d  %6.0f grants/s  p50 %v  p99 %v  %.2f cmds/grant", name, w, lk,
						h.GrantsPS, h.P50, h.P99, h.Cmds)
					runs[key{name, w, lk}] = append(runs[key{name, w, lk}], h)
				}
			}
		}
	}
	for _, lk := range cfg.Lockers {
		for _, w := range cfg.Waiters {
			for _, name := range Handoffers {
				hs := runs[key{name, w, lk}]
				sort.Slice(hs, func(i, j int) bool { return hs[i].GrantsPS < hs[j].GrantsPS })
				r.Handoffs = append(r.Handoffs, hs[len(hs)/2])
			}
		}
	}

	logf("storage: Redis")
	pairs, err := RunRedisStorage(ctx, srv, cfg.StorageOps, "s:")
	if err != nil {
		return nil, err
	}
	r.Storage = append(r.Storage, pairs...)
	if cfg.PostgresURL != "" {
		logf("storage: PostgreSQL")
		p, err := RunPostgres(ctx, cfg.PostgresURL, "fencekit_bench", cfg.StorageOps)
		if err != nil {
			return nil, fmt.Errorf("PostgreSQL: %w", err)
		}
		r.Storage = append(r.Storage, p)
	}
	r.Took = time.Since(r.Started)
	return r, nil
}

// Find returns the hand-off run of contender at waiters and lockers.
func (r *Results) Find(contender string, waiters, lockers int) (Handoff, bool) {
	for _, h := range r.Handoffs {
		if h.Contender == contender && h.Waiters == waiters && h.Lockers == lockers {
			return h, true
		}
	}
	return Handoff{}, false
}
