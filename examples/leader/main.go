package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/examples/internal/cli"
)

// memberEnv, set in a child's environment, makes the program run as a
// member even when it is not this command's own binary (a test binary).
const memberEnv = "FENCEKIT_LEADER_MEMBER"

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("leader", flag.ContinueOnError)
	fs.SetOutput(stderr)
	pgURL := fs.String("postgres", "postgres://postgres@127.0.0.1:5432/test", "PostgreSQL URL")
	redisAddr := fs.String("redis", "127.0.0.1:6379", "Redis address host:port")
	members := fs.Int("members", 3, "candidate processes")
	ttl := fs.Duration("ttl", 500*time.Millisecond, "term lease: how long a stopped or crashed leader keeps the election")
	beat := fs.Duration("beat", 50*time.Millisecond, "time between the leader's heartbeats")
	pause := fs.Duration("pause", 0, "how long the leader is stopped (SIGSTOP) (default 4 TTLs)")
	unfenced := fs.Bool("unfenced", false, "write heartbeats without the term's fence, to show the deposed leader's overwrite")
	failover := fs.Int("failover", 0, "instead of the pause, kill -9 the leader this many times and report failover times")
	verbose := fs.Bool("v", false, "with -failover, also print every line the members print")
	member := fs.String("member", "", "run as one candidate of that name (the parent starts these)")
	electionName := fs.String("election", "", "election name (default: one of this run's own)")
	prefix := fs.String("lock-prefix", "fencekit:", "Redis key prefix of the lock")
	if done, code := cli.Parse(fs, "leader", "processes elect a leader that writes a heartbeat to PostgreSQL under its term's fence; the leader is stopped (SIGSTOP), another is elected, and the old one's late write is refused (-unfenced: it overwrites)", args); done {
		return code
	}
	if *members < 2 || *ttl < 10*time.Millisecond || *beat <= 0 || *failover < 0 {
		fmt.Fprintln(stderr, "leader: -members must be at least 2, -ttl at least 10ms, -beat positive, -failover not negative")
		return 2
	}
	if *pause == 0 {
		*pause = 4 * *ttl
	}
	if *electionName == "" {
		*electionName = fmt.Sprintf("leader-%d", time.Now().UnixNano())
	}
	mc := memberConfig{
		Name: *member, Election: *electionName, PostgresURL: *pgURL, Redis: redis.Options{Addr: *redisAddr},
		LockPrefix: *prefix, TTL: *ttl, Beat: *beat, Unfenced: *unfenced,
	}
	if *member != "" {
		if err := runMember(ctx, mc, stdout); err != nil {
			fmt.Fprintf(stderr, "leader: %s: %v\n", *member, err)
			return 1
		}
		return 0
	}
	cfg := parentConfig{member: mc, members: *members, pause: *pause, failover: *failover, verbose: *verbose, args: args, out: stdout}
	err := runParent(ctx, cfg)
	var unreachable *unreachableError
	switch {
	case errors.As(err, &unreachable):
		fmt.Fprintln(stderr, "leader:", err)
		return 2
	case err != nil:
		fmt.Fprintln(stderr, "leader:", err)
		return 1
	}
	return 0
}

// unreachableError is a server the run could not reach, and the flag that
// names it.
type unreachableError struct {
	Server, Flag string
	Err          error
}

func (e *unreachableError) Error() string {
	return fmt.Sprintf("cannot reach %s (check %s): %v", e.Server, e.Flag, e.Err)
}

func (e *unreachableError) Unwrap() error { return e.Err }
