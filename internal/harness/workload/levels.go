package workload

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/fencekit/fencekit/fence"
)

// Refuser is a Counter whose store refuses some operations for reasons
// other than a stale fence, changing nothing (a serialization failure or
// a deadlock, which roll the transaction back): Run counts such a
// refusal (Result.Retryable), neither as an acknowledged write nor as an
// uncertain one, so a write refused this way that did land shows up as a
// phantom increment.
type Refuser interface {
	Refused(err error) bool
}

// LevelReporter is a Counter that counts, per isolation level, how its
// fenced transactions ended (Result.Levels).
type LevelReporter interface {
	LevelCounts() map[string]LevelCount
}

// LevelCount is what the fenced transactions run at one isolation level
// ended as.
type LevelCount struct {
	Admitted  int64 // committed under their fence
	Stale     int64 // refused as stale
	Retryable int64 // refused by a serialization failure or a deadlock
	Failed    int64 // any other error
}

// Judged is how many of them ended in a way the checker judges.
func (c LevelCount) Judged() int64 { return c.Admitted + c.Stale + c.Retryable }

// levelCounts keeps LevelCounts by level name, safe for concurrent use.
type levelCounts struct {
	mu sync.Mutex
	m  map[string]LevelCount
}

// note counts one fenced transaction at level that ended with err;
// retryable is the store's sentinel for a refusal that changed nothing.
func (l *levelCounts) note(level string, err, retryable error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[string]LevelCount{}
	}
	c := l.m[level]
	switch {
	case err == nil:
		c.Admitted++
	case errors.Is(err, fence.ErrStale):
		c.Stale++
	case errors.Is(err, retryable):
		c.Retryable++
	default:
		c.Failed++
	}
	l.m[level] = c
}

func (l *levelCounts) snapshot() map[string]LevelCount {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]LevelCount, len(l.m))
	for k, v := range l.m {
		out[k] = v
	}
	return out
}

// levelsString prints counts per level, in name order.
func levelsString(m map[string]LevelCount) string {
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	slices.Sort(names)
	var sb strings.Builder
	for i, k := range names {
		if i > 0 {
			sb.WriteString("; ")
		}
		c := m[k]
		fmt.Fprintf(&sb, "%s: admitted %d, stale %d, serialization failures %d, other errors %d", k, c.Admitted, c.Stale, c.Retryable, c.Failed)
	}
	return sb.String()
}
