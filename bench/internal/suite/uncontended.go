package suite

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Uncontended is one uncontended acquire+release workload: every contender's
// time per operation, measured with the contenders interleaved operation by
// operation (each goroutine takes them in turn, in a new random order every
// round), so that all see the same load.
type Uncontended struct {
	Name     string
	Parallel int  // goroutines
	Fresh    bool // a new resource for every operation
	Ops      int  // operations per contender
	Mean     map[string]time.Duration
	P50      map[string]time.Duration
}

// RunUncontended measures lockers (name → Locker) with ops operations each
// per goroutine.
func RunUncontended(ctx context.Context, lockers map[string]Locker, order []string, parallel, ops int, fresh bool, tag string) (Uncontended, error) {
	u := Uncontended{Parallel: parallel, Fresh: fresh, Ops: ops * parallel,
		Mean: map[string]time.Duration{}, P50: map[string]time.Duration{}}
	kind := "one repeated resource"
	if fresh {
		kind = "a fresh resource per operation"
	}
	u.Name = fmt.Sprintf("serial, %s", kind)
	if parallel > 1 {
		u.Name = fmt.Sprintf("%d goroutines, %s", parallel, kind)
	}
	var (
		mu      sync.Mutex
		samples = map[string][]time.Duration{}
		wg      sync.WaitGroup
		errOnce sync.Once
		first   error
	)
	for g := range parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := make([][]time.Duration, len(order))
			// A new random order every round: with a fixed rotation each
			// contender would nearly always run right after the same other
			// one, and what that one leaves behind (its client's goroutines,
			// the server's caches) would be charged to it. Seeded, so a run
			// can be repeated.
			rng := rand.New(rand.NewPCG(uint64(g), seedOf(tag)))
			perm := make([]int, len(order))
			for i := range perm {
				perm[i] = i
			}
			for i := range ops {
				resource := tag + "-" + strconv.Itoa(g)
				if fresh {
					resource += "-" + strconv.Itoa(i)
				}
				rng.Shuffle(len(perm), func(a, b int) { perm[a], perm[b] = perm[b], perm[a] })
				for _, j := range perm {
					t0 := time.Now()
					h, err := lockers[order[j]].TryAcquire(ctx, resource)
					if err == nil {
						err = h.Release(ctx)
					}
					if err != nil {
						errOnce.Do(func() { first = fmt.Errorf("%s: %w", order[j], err) })
						return
					}
					mine[j] = append(mine[j], time.Since(t0))
				}
			}
			mu.Lock()
			for j, name := range order {
				samples[name] = append(samples[name], mine[j]...)
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	if first != nil {
		return u, first
	}
	for name, s := range samples {
		u.Mean[name] = mean(s)
		u.P50[name] = percentile(s, 0.5)
	}
	return u, nil
}

// seedOf makes each workload's shuffles differ from the others' while a
// rerun repeats them.
func seedOf(tag string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(tag))
	return h.Sum64()
}

// Cost is what one acquire+release costs a contender outside the timing:
// heap allocations in the process and time spent in the Redis server.
type Cost struct {
	Allocs      float64            // heap allocations per operation
	ServerUs    float64            // µs of Redis command time per operation
	ServerCalls map[string]float64 // calls per operation, by command (inside scripts too)
	ClientCmds  float64            // commands the client sent per operation
}

// MeasureCost runs ops acquire+release of one repeated resource with l
// alone, counting allocations (runtime.MemStats, the library's background
// goroutines included) and the server's INFO commandstats.
func MeasureCost(ctx context.Context, contender string, l Locker, stats interface {
	Stats(context.Context) (map[string]CommandStat, error)
}, ops int, resource string) (Cost, error) {
	one := func() error {
		h, err := l.TryAcquire(ctx, resource)
		if err != nil {
			return err
		}
		return h.Release(ctx)
	}
	for range 100 {
		if err := one(); err != nil {
			return Cost{}, err
		}
	}
	before, err := stats.Stats(ctx)
	if err != nil {
		return Cost{}, err
	}
	cmds := l.Commands()
	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	for range ops {
		if err := one(); err != nil {
			return Cost{}, err
		}
	}
	runtime.ReadMemStats(&m1)
	cmds = l.Commands() - cmds
	after, err := stats.Stats(ctx)
	if err != nil {
		return Cost{}, err
	}
	c := Cost{Allocs: float64(m1.Mallocs-m0.Mallocs) / float64(ops), ClientCmds: float64(cmds) / float64(ops),
		ServerCalls: map[string]float64{}}
	for name, d := range diffStats(before, after) {
		if name == "info" {
			continue
		}
		c.ServerCalls[name] = float64(d.Calls) / float64(ops)
	}
	c.ServerUs = float64(ServerUsec(contender, before, after)) / float64(ops)
	return c, nil
}

// ServerUsec is the Redis server time, in µs, that contender's operations
// took between two readings of INFO commandstats: the scripts' time, which
// includes the commands they call (which the server also counts under their
// own names), plus that of the plain commands the contender sends.
func ServerUsec(contender string, before, after map[string]CommandStat) int64 {
	var us int64
	for name, d := range diffStats(before, after) {
		if name == "evalsha" || name == "eval" || plainCommands[contender][name] {
			us += d.Usec
		}
	}
	return us
}

// plainCommands are the commands each contender sends outside a script on
// the uncontended path (from their source); the rest run inside scripts.
var plainCommands = map[string]map[string]bool{
	Redsync: {"set": true}, // SET NX PX; the release is a script
	Floor:   {"set": true, "del": true},
}

// FormatCalls lists calls per operation, most frequent first.
func FormatCalls(calls map[string]float64) string {
	names := make([]string, 0, len(calls))
	for n := range calls {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool {
		if calls[names[i]] != calls[names[j]] {
			return calls[names[i]] > calls[names[j]]
		}
		return names[i] < names[j]
	})
	parts := make([]string, 0, len(names))
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%s %.3g", strings.ToUpper(n), calls[n]))
	}
	return strings.Join(parts, ", ")
}

func mean(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	var s time.Duration
	for _, x := range d {
		s += x
	}
	return s / time.Duration(len(d))
}

// percentile sorts d and returns its p-quantile.
func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[int(float64(len(d)-1)*p)]
}
