package election_test

import (
	"cmp"
	"context"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/election"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
)

// testTTL is the terms' lease in tests: short, so that a lost leader is
// replaced within a test's second, and long enough for a loaded machine to
// renew it.
const testTTL = 400 * time.Millisecond

// newLocker returns a Locker on c under a key prefix of t's own (prefix ""
// makes one on the shared server), closed when t ends.
func newLocker(t testing.TB, c redis.UniversalClient, prefix string) *lock.Locker {
	t.Helper()
	if prefix == "" {
		prefix = testenv.Prefix(t)
	}
	l, err := lock.New(c, lock.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l
}

// newElection returns the election name on l with the test TTL.
func newElection(t testing.TB, l *lock.Locker, name string, opts ...election.Option) *election.Election {
	t.Helper()
	e, err := election.New(l, name, append([]election.Option{election.WithTTL(testTTL)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// campaign runs Campaign in the background and delivers its outcome.
type outcome struct {
	term *election.Term
	err  error
	at   time.Time
}

func campaignAsync(ctx context.Context, e *election.Election, value string) <-chan outcome {
	ch := make(chan outcome, 1)
	go func() {
		t, err := e.Campaign(ctx, value)
		ch <- outcome{t, err, time.Now()}
	}()
	return ch
}

func mustCampaign(t testing.TB, e *election.Election, value string) *election.Term {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	term, err := e.Campaign(ctx, value)
	if err != nil {
		t.Fatalf("Campaign(%q): %v", value, err)
	}
	return term
}

// waitQueued waits until n candidates are queued for the election's lock.
func waitQueued(t testing.TB, c redis.UniversalClient, l *lock.Locker, name string, n int64) {
	t.Helper()
	queue := keysOf(l).LockKey(name)
	queue = queue[:len(queue)-len(":lock")] + ":queue"
	for deadline := time.Now().Add(10 * time.Second); c.ZCard(context.Background(), queue).Val() < n; time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("fewer than %d candidates queued after 10s", n)
		}
	}
}

func sortByToken(ls []election.Leader) {
	slices.SortFunc(ls, func(a, b election.Leader) int { return cmp.Compare(a.Token, b.Token) })
}
