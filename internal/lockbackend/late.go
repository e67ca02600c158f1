package lockbackend

import (
	"sync"
	"time"
)

// LateRequests remembers, by resource and holder, the latest local
// deadline of a grant request that may still reach the server after its
// caller stopped waiting for it: one whose reply was lost, whose retry
// answered in its place, or whose session could not be ended. Whoever
// gives the holder up (its release, its caller's giving up) undoes what
// such a request may still grant, once that deadline has passed. The SQL
// locks (PostgreSQL's void, MySQL's second release) share it. The zero
// value is ready to use.
type LateRequests struct {
	mu sync.Mutex
	m  map[[2]string]time.Time
}

// Note records that a request of holder's for resource, with local
// deadline late, may still be granted. Entries long past (a minute) are
// dropped: nothing was given up that needs them.
func (p *LateRequests) Note(resource, holder string, late time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = make(map[[2]string]time.Time)
	}
	now := time.Now()
	for k, t := range p.m {
		if now.Sub(t) > time.Minute {
			delete(p.m, k)
		}
	}
	k := [2]string{resource, holder}
	if late.After(p.m[k]) {
		p.m[k] = late
	}
}

// Take returns and forgets the deadline noted for holder's requests for
// resource.
func (p *LateRequests) Take(resource, holder string) (time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := [2]string{resource, holder}
	t, ok := p.m[k]
	delete(p.m, k)
	return t, ok
}
