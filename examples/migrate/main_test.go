package main

import (
	"context"
	"testing"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	rsgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"

	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
	fkredis "github.com/fencekit/fencekit/storage/redis"
)

// TestExampleSteps runs every before and after step of the example against
// the real redsync and redislock, and the paused holder, whose late write
// must be refused.
func TestExampleSteps(t *testing.T) {
	ctx := context.Background()
	client := testenv.Redis(t)
	prefix = testenv.Prefix(t)
	locker, err := lock.New(client, lock.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	store, err := fkredis.New(client, fkredis.WithPrefix(prefix+"data:"))
	if err != nil {
		t.Fatal(err)
	}
	rs := redsync.New(rsgoredis.NewPool(client))
	rl := redislock.New(client)
	steps := map[string]func() error{
		"redsync before":   func() error { return redsyncBefore(ctx, rs, client) },
		"redsync after":    func() error { return redsyncAfter(ctx, rs, locker, store) },
		"redislock before": func() error { return redislockBefore(ctx, rl, client) },
		"redislock after":  func() error { return redislockAfter(ctx, rl, locker, store) },
		"paused holder":    func() error { return pausedHolder(ctx, rl, locker, store) },
	}
	for name, step := range steps {
		if err := step(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	// Run the fenced steps again: a second grant gets a higher token and the
	// stored counts move on.
	for _, name := range []string{"redsync after", "redislock after"} {
		if err := steps[name](); err != nil {
			t.Errorf("%s, again: %v", name, err)
		}
	}
}
