// Command versus measures fencekit's Redis lock against its closest peers
// several times over, so that a ratio can be judged by how it varies from
// run to run rather than by one run:
//
//	go run ./cmd/versus                 # in bench/: 5 runs, about 2 minutes on a quiet machine
//	go run ./cmd/versus -runs 1 -quick  # seconds
//
// Each run starts a private redis-server and measures on it, in this order:
// the uncontended pair (TryAcquire + Release of one repeated resource,
// serial) of fencekit (on go-redis, and on rueidis through
// lock/rueidisfence), bsm/redislock, rueidislock and the floors,
// interleaved operation by operation (pairs per second); the Redis server's
// time per pair of each (INFO commandstats: the scripts' time, which
// includes the commands they call, plus the plain commands the client
// sent), the contenders taking turns in chunks of 100 pairs; and the
// contended hand-off of fencekit (on both clients) and rueidislock with each number of waiters
// of -waiters on one Locker, the two alternating run by run (grants per
// second, the hand-off's p50 and p99).
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fencekit/fencekit/bench/internal/suite"
)

func main() {
	runs := flag.Int("runs", 5, "runs; each measures everything once")
	quick := flag.Bool("quick", false, "short windows: exercises every part in seconds")
	waiters := flag.String("waiters", "8,100", "comma-separated numbers of waiters of the hand-off runs")
	flag.Parse()
	log.SetFlags(0)
	var ws []int
	for f := range strings.SplitSeq(*waiters, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			log.Fatalf("-waiters: %q is not a number of waiters", f)
		}
		ws = append(ws, n)
	}
	ops, costOps, warm, window := 3000, 3000, 300*time.Millisecond, 2*time.Second
	if *quick {
		ops, costOps, warm, window = 300, 300, 50*time.Millisecond, 300*time.Millisecond
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	uncontenders := []string{suite.Fencekit, suite.Redislock, suite.Rueidislock, suite.FencekitRueidis, suite.Floor, suite.FloorToken}
	type runResult struct {
		pairsPS  map[string]float64
		serverUs map[string]float64
		handoffs map[string]suite.Handoff // by contender and waiters
	}
	var results []runResult
	for run := range *runs {
		r := runResult{pairsPS: map[string]float64{}, serverUs: map[string]float64{}, handoffs: map[string]suite.Handoff{}}
		if err := func() error {
			srv, err := suite.StartServer(ctx)
			if err != nil {
				return err
			}
			defer srv.Stop()
			lockers := map[string]suite.Locker{}
			defer func() {
				for _, l := range lockers {
					l.Close()
				}
			}()
			for _, name := range uncontenders {
				if lockers[name], err = suite.NewLocker(name, srv.Addr, "v"+strconv.Itoa(run)+":"); err != nil {
					return err
				}
			}
			u, err := suite.RunUncontended(ctx, lockers, uncontenders, 1, ops, false, "v"+strconv.Itoa(run))
			if err != nil {
				return err
			}
			for name, d := range u.Mean {
				r.pairsPS[name] = 1 / d.Seconds()
			}
			// Server time, interleaved too: every contender in turn runs a
			// chunk of pairs between two readings of INFO commandstats, so
			// that all see the same load.
			const chunk = 100
			usec := map[string]int64{}
			for round := range costOps / chunk {
				for k := range uncontenders {
					name := uncontenders[(k+round)%len(uncontenders)]
					before, err := srv.Stats(ctx)
					if err != nil {
						return err
					}
					for range chunk {
						h, err := lockers[name].TryAcquire(ctx, "cost"+strconv.Itoa(run))
						if err == nil {
							err = h.Release(ctx)
						}
						if err != nil {
							return fmt.Errorf("%s: %w", name, err)
						}
					}
					after, err := srv.Stats(ctx)
					if err != nil {
						return err
					}
					usec[name] += suite.ServerUsec(name, before, after)
				}
			}
			for name, us := range usec {
				r.serverUs[name] = float64(us) / float64(costOps/chunk*chunk)
			}
			seq := 0
			for _, w := range ws {
				order := []string{suite.Fencekit, suite.Rueidislock, suite.FencekitRueidis}
				if run%2 == 1 {
					slices.Reverse(order)
				}
				for _, name := range order {
					seq++
					h, err := suite.RunHandoff(ctx, srv, name, w, 1, warm, window, "vh"+strconv.Itoa(run)+"-"+strconv.Itoa(seq)+":")
					if err != nil {
						return err
					}
					r.handoffs[name+"/"+strconv.Itoa(w)] = h
				}
			}
			return nil
		}(); err != nil {
			log.Fatalf("run %d: %v", run+1, err)
		}
		results = append(results, r)
		fmt.Fprintf(os.Stderr, "run %d of %d done\n", run+1, *runs)
	}

	fmt.Printf("Uncontended pair, serial, one repeated resource: pairs/s (fencekit / peer in parentheses)\n\n")
	fmt.Printf("| run |")
	for _, name := range uncontenders {
		fmt.Printf(" %s |", name)
	}
	fmt.Printf("\n|---|%s\n", strings.Repeat("---|", len(uncontenders)))
	for i, r := range results {
		fmt.Printf("| %d |", i+1)
		for _, name := range uncontenders {
			fmt.Printf(" %.0f (%.2f×) |", r.pairsPS[name], r.pairsPS[suite.Fencekit]/r.pairsPS[name])
		}
		fmt.Println()
	}
	fmt.Printf("\nOn rueidis: fencekit on rueidis / rueidislock, pairs/s, by run:")
	for _, r := range results {
		fmt.Printf(" %.2f×", r.pairsPS[suite.FencekitRueidis]/r.pairsPS[suite.Rueidislock])
	}
	fmt.Println()
	fmt.Printf("\nRedis server time per pair, µs (INFO commandstats; fencekit / peer in parentheses)\n\n")
	fmt.Printf("| run |")
	for _, name := range uncontenders {
		fmt.Printf(" %s |", name)
	}
	fmt.Printf("\n|---|%s\n", strings.Repeat("---|", len(uncontenders)))
	for i, r := range results {
		fmt.Printf("| %d |", i+1)
		for _, name := range uncontenders {
			fmt.Printf(" %.2f (%.2f×) |", r.serverUs[name], r.serverUs[suite.Fencekit]/r.serverUs[name])
		}
		fmt.Println()
	}
	for _, fk := range []string{suite.Fencekit, suite.FencekitRueidis} {
		fmt.Printf("\nContended hand-off on one Locker: %s against rueidislock\n\n", fk)
		fmt.Println("| run | waiters | fencekit grants/s | rueidislock grants/s | ratio | fencekit p50 | rueidislock p50 | ratio | fencekit p99 | rueidislock p99 | commands/grant | allocations/grant |")
		fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|---|")
		for _, w := range ws {
			for i, r := range results {
				f, q := r.handoffs[fk+"/"+strconv.Itoa(w)], r.handoffs[suite.Rueidislock+"/"+strconv.Itoa(w)]
				fmt.Printf("| %d | %d | %.0f | %.0f | %.2f× | %v | %v | %.2f× | %v | %v | %.2f / %.2f | %.0f / %.0f |\n", i+1, w, f.GrantsPS, q.GrantsPS, f.GrantsPS/q.GrantsPS,
					f.P50.Round(time.Microsecond), q.P50.Round(time.Microsecond), float64(f.P50)/float64(q.P50),
					f.P99.Round(time.Microsecond), q.P99.Round(time.Microsecond), f.Cmds, q.Cmds, f.Allocs, q.Allocs)
			}
		}
	}
}
