// Command lostupdate races workers through the lost-update timeline of a
// Redis lock and shows what fencing changes.
//
// Each worker repeatedly takes a short lease on an account, reads its
// balance, pauses (one time in four past the lease, as a GC pause or a slow
// network would), writes the balance plus one and releases. With the lock
// alone, a paused worker's late write overwrites the next holder's work and
// increments are lost. With fencing, storage refuses the late write and
// nothing is lost.
//
// With no flags it needs no servers: it runs an embedded Redis in-process.
// -redis and -postgres point it at real servers. It exits with status 1 if
// the fenced mode lost an update.
package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/fencekit/fencekit/examples/internal/cli"
	"github.com/fencekit/fencekit/internal/harness/workload"
	"github.com/fencekit/fencekit/lock"
	"github.com/fencekit/fencekit/migrations"
	fkredis "github.com/fencekit/fencekit/storage/redis"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("lostupdate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	redisAddr := fs.String("redis", "", "Redis address host:port (default: an embedded in-process Redis)")
	pgURL := fs.String("postgres", "", "PostgreSQL URL, e.g. postgres://postgres@127.0.0.1:5432/test (default: Redis storage only)")
	duration := fs.Duration("duration", 2*time.Second, "how long each mode runs")
	workers := fs.Int("workers", 4, "workers per account")
	ttl := fs.Duration("ttl", 20*time.Millisecond, "lease of every lock grant")
	if done, code := cli.Parse(fs, "lostupdate", "workers racing a plain lock and a fenced one: how many increments each loses (none, fenced)", args); done {
		return code
	}
	switch {
	case *duration <= 0:
		fmt.Fprintf(stderr, "lostupdate: -duration %v must be positive\n", *duration)
		return 2
	case *workers < 1:
		fmt.Fprintf(stderr, "lostupdate: -workers %d must be at least 1\n", *workers)
		return 2
	case *ttl < time.Millisecond:
		fmt.Fprintf(stderr, "lostupdate: -ttl %v must be at least 1ms\n", *ttl)
		return 2
	}
	ctx := context.Background()

	client, stop, where, err := connectRedis(ctx, *redisAddr)
	if err != nil {
		fmt.Fprintln(stderr, "lostupdate:", err)
		return 2
	}
	defer stop()
	runID := strconv.FormatInt(time.Now().UnixNano(), 36)
	prefix := "fencekit-demo:" + runID + ":"
	defer cleanup(client, prefix)

	locker, err := lock.New(client, lock.WithPrefix(prefix))
	if err != nil {
		fmt.Fprintln(stderr, "lostupdate:", err)
		return 2
	}
	store, err := fkredis.New(client, fkredis.WithPrefix(prefix+"data:"))
	if err != nil {
		fmt.Fprintln(stderr, "lostupdate:", err)
		return 2
	}
	counters := []workload.Counter{&workload.RedisCounter{Client: client, Store: store, PlainPrefix: prefix + "plain:"}}
	if *pgURL != "" {
		pool, err := connectPostgres(ctx, *pgURL)
		if err != nil {
			fmt.Fprintln(stderr, "lostupdate:", err)
			return 2
		}
		defer pool.Close()
		defer cleanupPostgres(pool, runID)
		counters = append(counters, &workload.PostgresCounter{Pool: pool})
	}

	fmt.Fprintf(stdout, "Lock and counters: %s. %d accounts, %d workers each, lease %v, %v per mode;\n",
		where, len(accounts), *workers, *ttl, *duration)
	fmt.Fprintf(stdout, "one pause in four lasts %v, past the lease.\n\n", 2**ttl)

	fencedLost := false
	for _, counter := range counters {
		var results []workload.Result
		var plainLog *eventLog
		for _, mode := range []workload.Mode{workload.Plain, workload.Fenced} {
			log := &eventLog{}
			res, err := workload.Run(ctx, workload.Config{
				Locker: locker, Counter: counter, Mode: mode,
				Resources: resourcesFor(runID, counter.Name(), mode),
				Workers:   *workers, TTL: *ttl, Duration: *duration,
				Events: log.add,
			})
			if err != nil {
				fmt.Fprintln(stderr, "lostupdate:", err)
				return 2
			}
			results = append(results, res)
			if mode == workload.Plain {
				plainLog = log
			}
			if mode == workload.Fenced && !res.Safe() {
				fencedLost = true
			}
		}
		printTable(stdout, counter.Name(), results)
		if plainLog != nil {
			printLostUpdate(stdout, plainLog, *ttl)
		}
	}
	if fencedLost {
		fmt.Fprintln(stdout, "FAIL: the fenced mode lost updates.")
		return 1
	}
	fmt.Fprintln(stdout, "The fenced mode lost nothing: every acknowledged increment is in the final balance.")
	return 0
}

// The accounts every run works on.
var accounts = []string{"acct-1", "acct-2", "acct-3"}

// resourcesFor gives each run, storage and mode accounts of their own, so
// that no counter or high-water mark carries over from another.
func resourcesFor(runID, storage string, mode workload.Mode) []string {
	tag := map[workload.Mode]string{workload.Plain: "plain", workload.Fenced: "fenced"}[mode]
	out := make([]string, len(accounts))
	for i, a := range accounts {
		out[i] = "demo-" + runID + "-" + storage + "-" + tag + "-" + a
	}
	return out
}

// connectRedis returns a client of the Redis at addr, or of an embedded
// in-process Redis when addr is empty.
func connectRedis(ctx context.Context, addr string) (*redis.Client, func(), string, error) {
	if addr == "" {
		mr := miniredis.NewMiniRedis()
		if err := mr.Start(); err != nil {
			return nil, nil, "", fmt.Errorf("embedded Redis: %w", err)
		}
		done := make(chan struct{})
		go advanceClock(mr, done) // the embedded Redis expires keys only when told time passed
		c := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
		return c, func() { close(done); c.Close(); mr.Close() }, "embedded Redis (miniredis)", nil
	}
	// Dial first: a client of a server that is down logs each failed dial
	// before its command fails, and those lines would come before our message.
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return nil, nil, "", fmt.Errorf("cannot reach Redis at %s: %v\nstart Redis there, pass another -redis host:port, or leave -redis out for the embedded Redis", addr, err)
	}
	conn.Close()
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := c.Ping(pctx).Err(); err != nil {
		c.Close()
		return nil, nil, "", fmt.Errorf("redis at %s: %w", addr, err)
	}
	return c, func() { c.Close() }, "Redis at " + addr, nil
}

// advanceClock moves the embedded Redis's clock with the real one. Leases
// expire within about one tick of their real time.
func advanceClock(mr *miniredis.Miniredis, done <-chan struct{}) {
	last := time.Now()
	t := time.NewTicker(250 * time.Microsecond)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case now := <-t.C:
			mr.FastForward(now.Sub(last))
			last = now
		}
	}
}

func connectPostgres(ctx context.Context, url string) (*pgxpool.Pool, error) {
	db, err := sql.Open("pgx", url)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer db.Close()
	if err := migrations.Up(ctx, db); err != nil {
		return nil, fmt.Errorf("apply PostgreSQL migrations: %w", err)
	}
	return pgxpool.New(ctx, url)
}

// cleanupPostgres deletes the rows this run created.
func cleanupPostgres(pool *pgxpool.Pool, runID string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	like := "demo-" + runID + "-%"
	_, _ = pool.Exec(ctx, `DELETE FROM fencekit_workload WHERE resource LIKE $1`, like)
	_, _ = pool.Exec(ctx, `DELETE FROM fencekit_guard WHERE resource LIKE $1`, like)
}

func cleanup(c *redis.Client, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		c.Del(ctx, iter.Val())
	}
}
