package lock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
)

// checkNodeMessage fails t unless msg is one line, names op once, and says
// "connection refused" for each of the nodes listed.
func checkNodeMessage(t *testing.T, what, msg, op string, nodes ...string) {
	t.Helper()
	if strings.Contains(msg, "\n") {
		t.Errorf("%s: %q spans several lines", what, msg)
	}
	if n := strings.Count(msg, "lock: "+op); n != 1 {
		t.Errorf("%s: %q says \"lock: %s\" %d times, want once", what, msg, op, n)
	}
	for _, node := range nodes {
		if !strings.Contains(msg, node+": dial tcp ") || !strings.Contains(msg, "connection refused") {
			t.Errorf("%s: %q does not give %s's own connection error", what, msg, node)
		}
	}
}

// TestRedlockMessagesNameDeadNodes: a failed quorum is one line, names its
// operation once, and tells a node that cannot be reached by its own dial
// error rather than by the deadline it ran into, also when the caller's
// context ran out first.
func TestRedlockMessagesNameDeadNodes(t *testing.T) {
	live := testenv.StartRedis(t)
	other := testenv.StartRedis(t)
	dead1, dead2 := testenv.StartRedis(t), testenv.StartRedis(t)
	c1, c2 := dead1.Client(), dead2.Client()
	dead1.Kill()
	dead2.Kill()
	ctx := context.Background()

	twoDead, err := lock.NewRedlock([]redis.UniversalClient{live.Client(), c1, c2})
	if err != nil {
		t.Fatal(err)
	}
	defer twoDead.Close()
	_, err = twoDead.TryAcquire(ctx, "r", time.Second)
	if !errors.Is(err, lock.ErrNoQuorum) {
		t.Fatalf("TryAcquire = %v, want ErrNoQuorum", err)
	}
	checkNodeMessage(t, "TryAcquire", err.Error(), "acquire", "node 1", "node 2")

	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond) // below the node timeout
	defer cancel()
	_, err = twoDead.Acquire(short, "r", time.Second)
	// Either the context ends while go-redis still retries the dead nodes'
	// dials, or go-redis, after the refusals above, fails their dials at
	// once and the try ends without a quorum (seen on a loaded CI machine):
	// a node error is not a refusal, so Acquire does not wait it out.
	// Either way the message must name both dead nodes.
	if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, lock.ErrNoQuorum) {
		t.Fatalf("Acquire with a short context = %v, want context.DeadlineExceeded or ErrNoQuorum", err)
	}
	checkNodeMessage(t, "Acquire with a short context", err.Error(), "acquire", "node 1", "node 2")

	// The live nodes must answer within the node timeout here: the
	// default (tens of milliseconds) is shorter than a first call takes on
	// a loaded machine with -race (seen: both live nodes timed out), and
	// the dead node's dial is refused at once whatever the timeout.
	oneDead, err := lock.NewRedlock([]redis.UniversalClient{live.Client(), other.Client(), c1}, lock.WithNodeTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer oneDead.Close()
	lease, err := oneDead.TryAcquire(ctx, "s", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// With the lock gone from one live node, only one node of three holds it.
	if err := live.Client().Del(ctx, keysOf(oneDead).LockKey("s")).Err(); err != nil {
		t.Fatal(err)
	}
	err = lease.Extend(ctx, time.Minute)
	if !errors.Is(err, lock.ErrNoQuorum) {
		t.Fatalf("Extend = %v, want ErrNoQuorum", err)
	}
	checkNodeMessage(t, "Extend", err.Error(), "extend", "node 2")
	_, err = lease.TTL(ctx)
	checkNodeMessage(t, "TTL", errText(err), "ttl", "node 2")
	err = lease.Release(ctx)
	checkNodeMessage(t, "Release", errText(err), "release", "node 2")
	if lerr := lease.Err(); lerr == nil || strings.Count(lerr.Error(), "lock: release") != 1 {
		t.Errorf("Lease.Err() = %v, want \"lock: release\" once", lerr)
	}
}

func errText(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}
