package pglock

import (
	"context"
	"fmt"
	"time"
)

// maxBroken is how many broken connections in a row a waiting Acquire
// rides out before it returns the error.
const maxBroken = 5

// acquire waits for resource in its queue, first come, first served across
// processes, and returns the grant. The release that frees the lock hands
// it to the first live waiter in the same statement and notifies it; the
// waiter then reads its grant in one more round trip. The first waiter
// also tries when the current lease ends (a holder that vanished), the
// second and third a little later each (in case those ahead vanished too),
// and every waiter refreshes its entry once a second. Without
// notifications (the listener is down, or polling was chosen) a waiter
// polls with backoff from 10ms to a second, never past the lease's end.
//
// When ctx ends the waiter leaves the queue in one round trip, releasing
// the lock if it was handed to it meanwhile (in the background, bounded,
// once ctx has ended), and the error matches ctx.Err().
func (b *backend) acquire(ctx context.Context, resource, holder string, ttl time.Duration) (*grant, error) {
	if err := checkArgs(ctx, "Acquire", resource, holder, ttl, true); err != nil {
		return nil, err
	}
	var sub *subscription
	if b.listen != nil {
		// Subscribed before the first try, so no hand-over is missed.
		sub = b.listen.subscribe(mark(resource))
		defer b.listen.unsubscribe(sub)
	}
	me := mark(holder)
	backoff := pollMin
	broken := 0
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		g, r, err := b.try(ctx, "Acquire", resource, holder, ttl, b.life, true)
		if err != nil && ctx.Err() == nil && isConnErr(err) && broken < maxBroken {
			// A connection that broke (a terminated backend, a network
			// fault): the pool drops it, and the try, which a retry with
			// the same holder id cannot repeat twice, goes again on another.
			broken++
			select {
			case <-ctx.Done():
			case <-time.After(time.Duration(broken) * pollMin):
			}
			continue
		}
		if err != nil {
			if ctx.Err() != nil || mayHaveRun(err) {
				b.releaseInBackground(resource, holder, true)
			}
			return nil, err
		}
		broken = 0
		if g != nil {
			return g, nil
		}
		d := b.refresh
		switch {
		case r.place == 0:
			d = r.remaining + time.Millisecond
		case r.place > 0 && r.place < 3:
			d = r.remaining + time.Duration(r.place)*nextInLine
		}
		d = min(d, b.refresh)
		if sub == nil || !b.listen.up() {
			d = min(d, backoff)
			backoff = min(2*backoff, b.refresh)
		} else {
			backoff = pollMin
		}
		timer.Reset(d)
	wait:
		for {
			var payload string
			var c chan string
			if sub != nil {
				c = sub.c
			}
			select {
			case <-ctx.Done():
				b.leaveAfter(ctx, resource, holder)
				return nil, fmt.Errorf("pglock: Acquire %q: %w", resource, ctx.Err())
			case <-timer.C:
				break wait
			case payload = <-c:
			}
			if payload == "" {
				break wait // the listener reconnected or went down
			}
			n, ok := parseNote(payload)
			if !ok || n.granted == me || n.placeOf(me) >= 0 || n.free() {
				timer.Stop()
				break wait
			}
		}
	}
}

// leaveAfter takes a waiter whose ctx ended out of the queue, in the
// background and bounded, releasing the lock if it was handed to it.
func (b *backend) leaveAfter(_ context.Context, resource, holder string) {
	b.releaseInBackground(resource, holder, true)
}
