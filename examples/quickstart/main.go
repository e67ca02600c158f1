// Command quickstart is the README's quick start as a complete program. It
// connects to Redis and PostgreSQL, applies fencekit's migrations, creates an
// invoices table, takes a lock on invoice 42, and under it makes a fenced
// read-modify-write and a fenced blind write in PostgreSQL and a fenced
// read-modify-write of a value kept in Redis. Each run adds 5 to the
// invoice's total in both stores.
//
// Usage:
//
//	go run ./examples/quickstart [-redis 127.0.0.1:6379] [-postgres postgres://postgres@127.0.0.1:5432/test]
//
// It writes the table invoices (row 42), fencekit's guard tables, the Redis
// keys of the lock on "invoice:42" and the value "invoice:42:total". It exits
// with status 2 when a server is unreachable and 1 on any other error.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/examples/internal/cli"
)

func main() {
	fs := flag.NewFlagSet("quickstart", flag.ContinueOnError)
	redisAddr := fs.String("redis", "127.0.0.1:6379", "Redis address (host:port)")
	postgresURL := fs.String("postgres", "postgres://postgres@127.0.0.1:5432/test", "PostgreSQL URL")
	if done, code := cli.Parse(fs, "quickstart", "the README's quick start: a lock on invoice 42 and fenced writes to PostgreSQL and Redis under it", os.Args[1:]); done {
		os.Exit(code)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	if err := reachable(ctx, *redisAddr, *postgresURL); err != nil {
		fmt.Fprintf(os.Stderr, "quickstart: %v\n", err)
		os.Exit(2)
	}
	if err := run(ctx, os.Stdout, *redisAddr, *postgresURL); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

// reachable checks both servers before the program uses them, so that a
// server that is down gets one clear message (and not the Redis client's own
// log lines about failed dials).
func reachable(ctx context.Context, redisAddr, postgresURL string) error {
	conn, err := net.DialTimeout("tcp", redisAddr, 2*time.Second)
	if err != nil {
		return fmt.Errorf("cannot reach Redis at %s: %v\nstart Redis there or pass -redis host:port", redisAddr, err)
	}
	conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	pg, err := pgx.Connect(ctx, postgresURL)
	if err != nil {
		return fmt.Errorf("cannot reach PostgreSQL at %s: %v\nstart PostgreSQL there or pass -postgres URL", redact(postgresURL), err)
	}
	return pg.Close(ctx)
}

// redact hides a password in a URL for messages.
func redact(u string) string {
	cfg, err := pgx.ParseConfig(u)
	if err != nil {
		return "the -postgres URL"
	}
	return fmt.Sprintf("%s:%d/%s", cfg.Host, cfg.Port, cfg.Database)
}
