package prevbackend

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// A busy backend grants each try's lease ahead of the try, so that the try
// itself is one write (the transaction that puts the key and returns the
// token) rather than two. The spare lease runs from its own grant, so a
// try believes it only for what is left of it, and takes it only while it
// is young: at most 1/20 of its TTL old. A backend that tries less often
// than that grants each lease in the try, and keeps no spare.

// spare is a lease granted before the try that takes it.
type spare struct {
	id   clientv3.LeaseID
	sent time.Time // when its grant was sent: it expires no sooner than sent + its TTL
}

func spareAge(secs int64) time.Duration { return time.Duration(secs) * time.Second / 20 }

// takeLease returns a lease of secs seconds for a try, and when its grant
// was sent: with useSpare, the spare if it is young, else one granted now.
// A try that follows the last one closely asks for the next spare in the
// background.
func (b *Backend) takeLease(ctx context.Context, secs int64, useSpare bool) (clientv3.LeaseID, time.Time, error) {
	if !useSpare {
		sent := time.Now()
		lg, err := b.cli.Grant(ctx, secs)
		if err != nil {
			return 0, sent, err
		}
		return lg.ID, sent, nil
	}
	now := time.Now()
	b.mu.Lock()
	s, ok := b.spares[secs]
	delete(b.spares, secs)
	busy := now.Sub(b.lastTry[secs]) < spareAge(secs)
	b.lastTry[secs] = now
	b.mu.Unlock()
	if busy || ok {
		b.refill(secs)
	}
	if ok && now.Sub(s.sent) < spareAge(secs) {
		return s.id, s.sent, nil
	}
	// A spare grown old holds no key and expires on its own.
	sent := time.Now()
	lg, err := b.cli.Grant(ctx, secs)
	if err != nil {
		return 0, sent, err
	}
	return lg.ID, sent, nil
}

// giveBack keeps a lease a refused try did not use as the spare, if it is
// young and no spare is kept; else it is revoked.
func (b *Backend) giveBack(ctx context.Context, id clientv3.LeaseID, sent time.Time, secs int64) {
	b.mu.Lock()
	_, have := b.spares[secs]
	if !have && !b.closed && time.Since(sent) < spareAge(secs) {
		b.spares[secs] = spare{id, sent}
		b.mu.Unlock()
		return
	}
	b.mu.Unlock()
	b.revokeLater(ctx, id)
}

// refill grants the next spare lease of secs seconds in the background,
// one at a time.
func (b *Backend) refill(secs int64) {
	b.mu.Lock()
	if b.closed || b.filling[secs] {
		b.mu.Unlock()
		return
	}
	b.filling[secs] = true
	b.wg.Add(1)
	b.mu.Unlock()
	go func() {
		defer b.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), cleanupBound)
		defer cancel()
		go func() {
			select {
			case <-b.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		sent := time.Now()
		lg, err := b.cli.Grant(ctx, secs)
		b.mu.Lock()
		delete(b.filling, secs)
		keep := err == nil && !b.closed
		if keep {
			if old, ok := b.spares[secs]; ok && old.sent.After(sent) {
				keep = false
			} else {
				b.spares[secs] = spare{lg.ID, sent}
			}
		}
		b.mu.Unlock()
		if err == nil && !keep {
			rctx, rcancel := context.WithTimeout(context.Background(), cleanupBound)
			_, _ = b.cli.Revoke(rctx, lg.ID)
			rcancel()
		}
	}()
}

// revokeSpares revokes the spare leases left at Close, within deadline.
func (b *Backend) revokeSpares(deadline time.Time) {
	b.mu.Lock()
	spares := b.spares
	b.spares = map[int64]spare{}
	b.mu.Unlock()
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	for _, s := range spares {
		_, _ = b.cli.Revoke(ctx, s.id)
	}
}
