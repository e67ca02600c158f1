package redis

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/internal/harness/testenv"
)

// TestHotKeyRecords measures what the retry records of one hot key cost: 8
// goroutines write one key with fenced Sets for FENCEKIT_HOTKEY seconds on a
// private server, with the store's default retry window; then the writes
// stop and the test waits one window. It logs records (keys or hash fields
// beyond the value's own) per write, memory per write within the window,
// per-write p50/p99, the worst PING while records expire, the records and
// memory left one window after the last write, and the time to delete the
// value's key. It runs only when FENCEKIT_HOTKEY is set;
// FENCEKIT_HOTKEY_WINDOW sets a shorter window in seconds (on a client that
// never retries), for repeated runs:
//
//	FENCEKIT_HOTKEY=20 go test -run TestHotKeyRecords -v -timeout 30m ./storage/redis/
func TestHotKeyRecords(t *testing.T) {
	secs, _ := strconv.Atoi(os.Getenv("FENCEKIT_HOTKEY"))
	if secs <= 0 {
		t.Skip("set FENCEKIT_HOTKEY to the seconds of writing to measure the hot key")
	}
	ctx := context.Background()
	srv := testenv.StartRedis(t)
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr()}) // go-redis defaults
	t.Cleanup(func() { _ = c.Close() })
	var opts []Option
	if w, _ := strconv.Atoi(os.Getenv("FENCEKIT_HOTKEY_WINDOW")); w > 0 {
		// A shorter window, for repeated runs: on a client that never
		// retries, which any window covers.
		c = goredis.NewClient(&goredis.Options{Addr: srv.Addr(), MaxRetries: -1})
		t.Cleanup(func() { _ = c.Close() })
		opts = append(opts, WithRetryWindow(time.Duration(w)*time.Second))
	}
	s, err := New(c, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Preload(ctx); err != nil {
		t.Fatal(err)
	}
	window := s.retryWindow
	// Redis's own latency monitor times every expire cycle and slow command
	// on the server, apart from this machine's scheduling of the pinger.
	if err := c.ConfigSet(ctx, "latency-monitor-threshold", "1").Err(); err != nil {
		t.Fatal(err)
	}
	f, v := fen(1, "hot"), benchValue()
	key := s.Prefix() + "hot"
	if _, err := s.FencedSet(ctx, f, "hot", v); err != nil {
		t.Fatal(err)
	}
	if _, err := s.FencedSet(ctx, f, "hot", v); err != nil { // the hash in its steady form
		t.Fatal(err)
	}
	fieldsAlone := int(c.HLen(ctx, key).Val())
	memAlone := usedMemory(t, c)

	// A separate client pings the server every 5 ms for the whole run.
	pinger := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), PoolSize: 1})
	t.Cleanup(func() { _ = pinger.Close() })
	var worstPing atomic.Int64
	var pingMu sync.Mutex
	var pings []time.Duration
	stopPing := make(chan struct{})
	var pingDone sync.WaitGroup
	pingDone.Go(func() {
		for {
			select {
			case <-stopPing:
				return
			case <-time.After(5 * time.Millisecond):
			}
			t0 := time.Now()
			_ = pinger.Ping(ctx).Err()
			d := int64(time.Since(t0))
			pingMu.Lock()
			pings = append(pings, time.Duration(d))
			pingMu.Unlock()
			for {
				old := worstPing.Load()
				if d <= old || worstPing.CompareAndSwap(old, d) {
					break
				}
			}
		}
	})
	defer func() { close(stopPing); pingDone.Wait() }()

	const workers = 8
	lat := make([][]time.Duration, workers)
	end := time.Now().Add(time.Duration(secs) * time.Second)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for time.Now().Before(end) {
				t0 := time.Now()
				if _, err := s.FencedSet(ctx, f, "hot", v); err != nil {
					t.Error(err)
					return
				}
				lat[w] = append(lat[w], time.Since(t0))
			}
		})
	}
	wg.Wait()
	stopped := time.Now()
	all := slices.Concat(lat...)
	slices.Sort(all)
	writes := len(all)
	if writes == 0 {
		t.Fatal("no writes")
	}
	records := recordCount(t, c, key, fieldsAlone)
	mem := usedMemory(t, c)
	t.Logf("window %v, %d writes in %ds (%.0f/s)", window, writes, secs, float64(writes)/float64(secs))
	t.Logf("records per write %.2f (%d records), bytes per write %.0f, p50 %v, p99 %v, worst PING while writing %v",
		float64(records)/float64(writes), records, float64(mem-memAlone)/float64(writes),
		all[writes/2], all[writes*99/100], time.Duration(worstPing.Swap(0)))
	logLatency(t, c, "while writing")
	pingMu.Lock()
	pings = pings[:0]
	pingMu.Unlock()

	// The writes have stopped: wait one window (and a little for Redis's
	// active expiry), pinging all along.
	time.Sleep(time.Until(stopped.Add(window + 5*time.Second)))
	left := recordCount(t, c, key, fieldsAlone)
	pingMu.Lock()
	slices.Sort(pings)
	n := len(pings)
	t.Logf("one window after the last write: %d records left, memory %+d bytes against the value alone; PING while records expired: %d pings, p50 %v, p99 %v, p99.9 %v, worst %v",
		left, usedMemory(t, c)-memAlone, n, pings[n/2], pings[n*99/100], pings[n*999/1000], time.Duration(worstPing.Swap(0)))
	pingMu.Unlock()
	logLatency(t, c, "while records expired")

	t0 := time.Now()
	if err := c.Del(ctx, key).Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("DEL of the value's key took %v", time.Since(t0))
	logLatency(t, c, "at the DEL")
}

// logLatency logs and resets what Redis's latency monitor saw: the longest
// expire cycle, command and so on, timed on the server.
func logLatency(t *testing.T, c *goredis.Client, when string) {
	t.Helper()
	ctx := context.Background()
	rows, err := c.Do(ctx, "LATENCY", "LATEST").Slice()
	if err != nil {
		t.Fatal(err)
	}
	var parts []string
	for _, r := range rows {
		row, _ := r.([]any)
		if len(row) < 4 {
			continue
		}
		// Every event of the kind over the threshold, for its median.
		hist, err := c.Do(ctx, "LATENCY", "HISTORY", row[0]).Slice()
		if err != nil {
			t.Fatal(err)
		}
		var ms []int64
		for _, h := range hist {
			if p, _ := h.([]any); len(p) == 2 {
				v, _ := p[1].(int64)
				ms = append(ms, v)
			}
		}
		slices.Sort(ms)
		median := int64(0)
		if len(ms) > 0 {
			median = ms[len(ms)/2]
		}
		parts = append(parts, fmt.Sprintf("%v: %d events, median %d ms, max %v ms", row[0], len(ms), median, row[3]))
	}
	t.Logf("server latency events %s (threshold 1 ms): %v", when, parts)
	if err := c.Do(ctx, "LATENCY", "RESET").Err(); err != nil {
		t.Fatal(err)
	}
}

// recordCount counts the keys and hash fields a private server holds beyond
// the value's own fieldsAlone fields: the records of its writes, whatever
// their layout.
func recordCount(t *testing.T, c *goredis.Client, key string, fieldsAlone int) int {
	t.Helper()
	ctx := context.Background()
	keys := int(c.DBSize(ctx).Val())
	fields := int(c.HLen(ctx, key).Val())
	return keys - 1 + fields - fieldsAlone
}

func usedMemory(t *testing.T, c *goredis.Client) int64 {
	t.Helper()
	info, err := c.InfoMap(context.Background(), "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	used, err := strconv.ParseInt(info["Memory"]["used_memory"], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return used
}
