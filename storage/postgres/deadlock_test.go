package postgres_test

import (
	"errors"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/storage/postgres"
)

// Two transactions guard resources a and b, naming them in opposite orders,
// many times over and at once: GuardAll locks in sorted order, so neither
// ever becomes a deadlock victim.
func TestGuardAllOppositeOrdersDoNotDeadlock(t *testing.T) {
	ctx, pool := setup(t)
	for i := range 50 {
		orders := [2][2]string{{"a", "b"}, {"b", "a"}}
		start := make(chan struct{})
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for j := range 2 {
			wg.Go(func() {
				token := int64(2*i + j + 1)
				fs := []fence.Fence{fenceOf(orders[j][0], token, "h"), fenceOf(orders[j][1], token, "h")}
				<-start
				errs[j] = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					if err := postgres.GuardAll(ctx, tx, fs...); err != nil {
						return err
					}
					// Hold both rows a moment so the rounds overlap.
					_, err := tx.Exec(ctx, `SELECT pg_sleep(0.001)`)
					return err
				})
			})
		}
		close(start)
		wg.Wait()
		for j, err := range errs {
			if err != nil && !errors.Is(err, fence.ErrStale) {
				t.Fatalf("round %d, transaction %d: %v", i, j, err)
			}
		}
	}
}

// Negative control: guarding the same two resources one by one in opposite
// orders, interleaved, deadlocks; PostgreSQL aborts one transaction and the
// victim's error matches ErrRetryable and carries SQLSTATE 40P01.
func TestGuardOppositeOrdersOneByOneDeadlock(t *testing.T) {
	ctx, pool := setup(t)
	c1, c2 := acquire(t, ctx, pool), acquire(t, ctx, pool)
	tx1, err := c1.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx1.Rollback(ctx)
	tx2, err := c2.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx2.Rollback(ctx)
	if err := postgres.Guard(ctx, tx1, fenceOf("a", 1, "one")); err != nil {
		t.Fatal(err)
	}
	if err := postgres.Guard(ctx, tx2, fenceOf("b", 2, "two")); err != nil {
		t.Fatal(err)
	}
	done1 := make(chan error, 1)
	go func() { done1 <- postgres.Guard(ctx, tx1, fenceOf("b", 1, "one")) }()
	waitBlocked(t, ctx, pool, c1.Conn().PgConn().PID())
	err2 := postgres.Guard(ctx, tx2, fenceOf("a", 2, "two"))
	if err2 == nil {
		_ = tx2.Commit(ctx) // frees tx1 if tx1 was the victim
	} else {
		_ = tx2.Rollback(ctx)
	}
	err1 := <-done1
	victim := err1
	if victim == nil || errors.Is(victim, fence.ErrStale) {
		victim = err2
	}
	if !errors.Is(victim, postgres.ErrRetryable) {
		t.Fatalf("no deadlock victim: tx1 %v, tx2 %v", err1, err2)
	}
	var pgErr *pgconn.PgError
	if !errors.As(victim, &pgErr) || pgErr.Code != "40P01" {
		t.Fatalf("victim error %v does not carry SQLSTATE 40P01", victim)
	}
}
