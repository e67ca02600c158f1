package election_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/election"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lock"
	"github.com/fencekit/fencekit/storage/postgres"
)

// Run keeps this process in the election: fn runs while it leads, with a
// ctx that ends when the term is lost, and every write it makes carries the
// term's fence, so a deposed leader's late write is refused.
func ExampleRun() {
	ctx := context.Background()
	locker, err := lock.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"}))
	if err != nil {
		panic(err)
	}
	defer locker.Close()
	e, err := election.New(locker, "scheduler", election.WithTTL(5*time.Second))
	if err != nil {
		panic(err)
	}
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test")
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	err = election.Run(ctx, e, "host-a:8080", func(ctx context.Context, f fence.Fence) error {
		for {
			err := postgres.InTx(ctx, pool, pgx.TxOptions{}, f, func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `UPDATE jobs SET owner = $1 WHERE due < now()`, "host-a")
				return err
			})
			switch {
			case errors.Is(err, fence.ErrStale):
				return nil // a newer leader has written: this term is over; Run campaigns again
			case err != nil && ctx.Err() == nil:
				fmt.Println("heartbeat failed, trying again:", err)
			}
			select {
			case <-ctx.Done():
				return ctx.Err() // the term was lost: Run campaigns again
			case <-time.After(time.Second):
			}
		}
	})
	fmt.Println(err)
}

// Campaign and Resign, as etcd's concurrency.Election offers them.
func ExampleElection_Campaign() {
	ctx := context.Background()
	locker, err := lock.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"}))
	if err != nil {
		panic(err)
	}
	defer locker.Close()
	e, err := election.New(locker, "compactor")
	if err != nil {
		panic(err)
	}
	term, err := e.Campaign(ctx, "host-b")
	if err != nil {
		panic(err)
	}
	fmt.Println("leading with token", term.Fence().Token)
	select {
	case <-term.Done():
		fmt.Println("term lost:", term.Err())
	case <-time.After(time.Minute):
		_ = term.Resign(ctx) // the next queued candidate leads at once
	}
}

// Observe follows the election from any process, candidate or not.
func ExampleElection_Observe() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	locker, err := lock.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"}))
	if err != nil {
		panic(err)
	}
	defer locker.Close()
	e, err := election.New(locker, "scheduler")
	if err != nil {
		panic(err)
	}
	if l, err := e.Leader(ctx); err == nil {
		fmt.Println("leader now:", l.Value)
	} else if errors.Is(err, election.ErrNoLeader) {
		fmt.Println("nobody leads")
	}
	for l := range e.Observe(ctx) {
		fmt.Printf("leader %s (term %d)\n", l.Value, l.Token)
	}
}
