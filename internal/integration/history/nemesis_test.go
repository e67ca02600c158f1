package history

import (
	"context"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/fencekit/fencekit/internal/harness/testenv"
)

// nemesis injects faults into the proxies until ctx ends, one every gap/8
// to gap on a proxy chosen at random: a lost reply (the connection is cut
// after the server ran the command), a reply held for hold (past the
// client's read timeout), every connection cut, or a latency of up to 30
// ms each way. It then clears the latency. Which faults actually happened
// is counted by the proxies (Proxy.Faults); latency changes in latency.
func nemesis(ctx context.Context, proxies []*testenv.Proxy, rng *rand.Rand, gap, hold time.Duration, latency *atomic.Int64) {
	defer func() {
		for _, p := range proxies {
			p.SetLatency(0)
		}
	}()
	for {
		t := time.NewTimer(gap/8 + time.Duration(rng.Int64N(int64(gap-gap/8))))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		p := proxies[rng.IntN(len(proxies))]
		switch n := rng.IntN(100); {
		case n < 35:
			p.LoseNextReply(nil)
		case n < 55:
			p.HoldNextReply(hold, nil)
		case n < 65:
			p.CutAll()
		case n < 85:
			if rng.IntN(3) == 0 {
				p.SetLatency(0)
			} else {
				p.SetLatency(time.Duration(1+rng.IntN(30)) * time.Millisecond)
			}
			latency.Add(1)
		}
	}
}
