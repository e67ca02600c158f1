package lock_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
	"github.com/redis/go-redis/v9"
)

// TestEveryGrantPathHoldsWhatItPromises: whichever script grants the lock
// (try_fast.lua on a free lock, try.lua when the counter is ahead of the
// clock, acquire.lua for an owner, the hand-over in release.lua) and after
// an Extend, Redis holds the key at least as long as the lease's Validity
// says. The key's PTTL is read before the Validity, so on any machine
// PTTL >= Validity (less the millisecond PTTL rounds away) unless a script
// set a shorter expiry than it reported.
func TestEveryGrantPathHoldsWhatItPromises(t *testing.T) {
	ctx := context.Background()
	c := testenv.Redis(t)
	prefix := testenv.Prefix(t)
	l, err := lock.New(c, lock.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	const ttl = 3 * time.Second
	key := func(resource string) string { return prefix + "{" + resource + "}:lock" }
	check := func(what, resource string, lease *lock.Lease) {
		t.Helper()
		pttl, err := c.PTTL(ctx, key(resource)).Result()
		if err != nil {
			t.Fatal(err)
		}
		v := lease.Validity()
		if pttl < v-time.Millisecond {
			t.Fatalf("%s: Redis holds the key %v more, the lease's Validity is %v", what, pttl, v)
		}
		if pttl <= 0 {
			t.Fatalf("%s: the key has no expiry (PTTL %v)", what, pttl)
		}
	}

	// The fast path: a free lock, no token state.
	lease, err := l.TryAcquire(ctx, "fast", ttl)
	if err != nil {
		t.Fatal(err)
	}
	check("a free lock's grant (try_fast.lua)", "fast", lease)

	// The counter ahead of the clock: try_fast.lua passes, try.lua grants.
	if err := l.Advance(ctx, "ahead", fence.Token(time.Now().UnixMicro()+int64(time.Minute/time.Microsecond))); err != nil {
		t.Fatal(err)
	}
	lease, err = l.TryAcquire(ctx, "ahead", ttl)
	if err != nil {
		t.Fatal(err)
	}
	check("a grant over a counter ahead of the clock (try.lua)", "ahead", lease)

	// An owner's grant: acquire.lua.
	lease, err = l.Acquire(ctx, "owned", ttl, lock.Owner("owner-a"))
	if err != nil {
		t.Fatal(err)
	}
	check("an owner's grant (acquire.lua)", "owned", lease)

	// An extension.
	lease, err = l.TryAcquire(ctx, "extended", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Extend(ctx, ttl); err != nil {
		t.Fatal(err)
	}
	check("an extension (extend.lua)", "extended", lease)

	// A hand-over: a waiter queued behind a holder gets the lock from the
	// holder's release.
	holder, err := l.TryAcquire(ctx, "handed", ttl)
	if err != nil {
		t.Fatal(err)
	}
	w, err := lock.New(c, lock.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	got := make(chan *lock.Lease, 1)
	go func() {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		lease, err := w.Acquire(actx, "handed", ttl)
		if err != nil {
			t.Error(err)
		}
		got <- lease
	}()
	waitQueued(t, c, w, "handed", 1)
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if lease := <-got; lease != nil {
		check("a hand-over (release.lua)", "handed", lease)
	}
}

// slowReply holds every reply for delay before the caller sees it: the
// time a reply spends in a slow network or a paused client.
type slowReply struct{ delay atomic.Int64 }

func (h *slowReply) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *slowReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *slowReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		time.Sleep(time.Duration(h.delay.Load()))
		return err
	}
}

// TestValidityCountsFromBeforeTheSend: a lease's Validity, after a grant
// or an extension whose reply took 400 ms to arrive, is at most the TTL
// less those 400 ms: Redis started the lease when the script ran, before
// the reply's delay, so a lease counted from the reply would be believed
// past the key's end.
func TestValidityCountsFromBeforeTheSend(t *testing.T) {
	ctx := context.Background()
	const ttl, delay = 3 * time.Second, 400 * time.Millisecond
	slow := &slowReply{}
	c := testenv.Redis(t) // a client of this test's own
	c.AddHook(slow)
	l := newLocker(t, c)
	defer l.Close()
	slow.delay.Store(int64(delay))
	lease, err := l.TryAcquire(ctx, "slow", ttl)
	if err != nil {
		t.Fatal(err)
	}
	if v := lease.Validity(); v > ttl-delay {
		t.Fatalf("Validity %v after a grant whose reply took %v: want at most %v", v, delay, ttl-delay)
	}
	if err := lease.Extend(ctx, ttl); err != nil {
		t.Fatal(err)
	}
	if v := lease.Validity(); v > ttl-delay {
		t.Fatalf("Validity %v after an extension whose reply took %v: want at most %v", v, delay, ttl-delay)
	}
	slow.delay.Store(0)
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
