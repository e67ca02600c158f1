package election

import (
	"context"
	"errors"
	"fmt"

	"github.com/fencekit/fencekit/internal/lockbackend"
	"github.com/fencekit/fencekit/lock"
)

// Proclaim changes the leader's value without resigning, as etcd's
// Election.Proclaim does: the leader record's value becomes value, fenced
// to this term (only while its lock is this term's and the record names
// it), and [Election.Leader] and [Election.Observe] report it with the
// term's token. The term, its token and its fence stay as they were.
//
// It returns nil once the record holds value (a quorum of nodes under
// Redlock). On a Locker whose backend cannot change a record within a
// grant it returns an error matching [fence.ErrInvalid]. It returns an
// error matching [Term.Err] when the term had
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
	p, ok := e.rec.(lockbackend.Proclaimer)
	if !ok {
		return fmt.Errorf("election: Proclaim %q term %d: %w", e.name, t.fence.Token, lockbackend.ErrUnsupported)
	}
	err := p.ProclaimRecord(ctx, t.fence, value)
	switch {
	case err == nil:
		t.mu.Lock()
		t.value = value
		t.mu.Unlock()
		return nil
	case errors.Is(err, lock.ErrNotHeld):
		return fmt.Errorf("election: Proclaim %q term %d: the lock or leader record is no longer the term's: %w", e.name, t.fence.Token, lock.ErrNotHeld)
	}
	return fmt.Errorf("election: Proclaim %q term %d: %w", e.name, t.fence.Token, err)
}
