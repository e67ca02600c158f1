package election

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/lock"
)

// Proclaim changes the leader's value without resigning, as etcd's
// Election.Proclaim does: the leader record's value becomes value, fenced
// to this term (only while its lock is this term's and the record names
// it), and [Election.Leader] and [Election.Observe] report it with the
// term's token. The term, its token and its fence stay as they were.
//
// It returns nil once the record holds value (a quorum of nodes under
// Redlock). It returns an error matching [Term.Err] when the term had
// ended, [lock.ErrNotHeld] when the lock or the record is no longer this
// term's (nothing changed: the term is over, and [Term.Done] closes soon),
// [fence.ErrInvalid] for a value [Election.Campaign] would refuse, and an
// error matching ctx.Err() when ctx ended first (the change may still be
// made). A client retry of a change already made changes and announces
// nothing more. Under Redlock, a Proclaim that failed may have changed the
// value on some nodes, which a read of those nodes can report.
func (t *Term) Proclaim(ctx context.Context, value string) error {
	if err := checkCtx("Proclaim", ctx); err != nil {
		return err
	}
	if err := checkValue("Proclaim", value); err != nil {
		return err
	}
	if err := t.Err(); err != nil {
		return fmt.Errorf("election: Proclaim %q term %d: %w", t.e.name, t.fence.Token, err)
	}
	e := t.e
	keys := []string{e.lockKey, e.recordKey}
	tok := fmt.Sprint(uint64(t.fence.Token))
	replies := e.fanOut(ctx, func(ctx context.Context, c redis.UniversalClient) (any, error) {
		return proclaimScript.Run(ctx, c, keys, t.fence.Holder, tok, value, e.channel, e.sharded).Int64()
	})
	ok, gone := 0, 0
	var errs []error
	for _, r := range replies {
		switch {
		case r.err != nil:
			errs = append(errs, r.err)
		case r.val == int64(1):
			ok++
		default:
			gone++
		}
	}
	switch {
	case ok >= e.quorum:
		t.mu.Lock()
		t.value = value
		t.mu.Unlock()
		return nil
	case gone > len(e.nodes)-e.quorum:
		return fmt.Errorf("election: Proclaim %q term %d: the lock or leader record is no longer the term's: %w", e.name, t.fence.Token, lock.ErrNotHeld)
	}
	return fmt.Errorf("election: Proclaim %q term %d: %w", e.name, t.fence.Token, errors.Join(errs...))
}
