package history

import (
	"fmt"
	"math/rand/v2"
	"sync"
)

// keyRing hands out the keys the workers use: a few at a time, each
// retired after a number of calls or of open calls, so that every key's
// history stays small enough to check quickly. A retired key is never used
// again.
type keyRing struct {
	mu      sync.Mutex
	slots   []string
	calls   map[string]int
	open    map[string]int
	maxOps  int
	maxOpen int
	next    int
}

func newKeyRing(slots, maxOps, maxOpen int) *keyRing {
	k := &keyRing{slots: make([]string, slots), calls: map[string]int{}, open: map[string]int{}, maxOps: maxOps, maxOpen: maxOpen}
	for i := range k.slots {
		k.slots[i] = k.fresh()
	}
	return k
}

func (k *keyRing) fresh() string {
	k.next++
	return fmt.Sprintf("k%d", k.next)
}

// pick returns a key in use, counting a call on it.
func (k *keyRing) pick(rng *rand.Rand) string {
	k.mu.Lock()
	defer k.mu.Unlock()
	i := rng.IntN(len(k.slots))
	key := k.slots[i]
	k.calls[key]++
	if k.calls[key] >= k.maxOps {
		k.slots[i] = k.fresh()
	}
	return key
}

// opened counts an open call on key, and retires key after too many.
func (k *keyRing) opened(key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.open[key]++
	if k.open[key] < k.maxOpen {
		return
	}
	for i, s := range k.slots {
		if s == key {
			k.slots[i] = k.fresh()
		}
	}
}

// used returns how many keys were handed out.
func (k *keyRing) used() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.calls)
}
