package rueidisfence

import (
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
)

// checkNodeMessage fails t unless msg is one line, names op once, and
// gives each of nodes' own dial error ("connection refused").
func checkNodeMessage(t *testing.T, what, msg, op string, nodes ...string) {
	t.Helper()
	if strings.Contains(msg, "\n") {
		t.Errorf("%s: %q spans several lines", what, msg)
	}
	if n := strings.Count(msg, "lock: "+op); n != 1 {
		t.Errorf("%s: %q says \"lock: %s\" %d times, want once", what, msg, op, n)
	}
	for _, node := range nodes {
		i := strings.Index(msg, node+": ")
		if i < 0 || !strings.HasPrefix(msg[i+len(node)+2:], "dial tcp ") || !strings.Contains(msg[i:], "connection refused") {
			t.Errorf("%s: %q does not give %s's own dial error", what, msg, node)
		}
	}
}

func errText(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// TestRedlockNamesDeadNodes: a Redlock Locker of rueidis clients tells a
// node it cannot reach (a server stopped, its port closed) by the node's
// own dial error, on every operation, in a one-line message, as
// lock.NewRedlock's does on go-redis.
func TestRedlockNamesDeadNodes(t *testing.T) {
	ctx := ctxFor(t, time.Minute)
	live, other := testenv.StartRedis(t), testenv.StartRedis(t)
	dead1, dead2 := testenv.StartRedis(t), testenv.StartRedis(t)
	// rueidis connects when the client is made, so the dead nodes' clients
	// are made while their servers run; the first call after the servers
	// stop meets the end of that connection (EOF), and every later call
	// dials again.
	c1, c2 := rueidisClient(t, dead1.Addr()), rueidisClient(t, dead2.Addr())
	dead1.Kill()
	dead2.Kill()
	for _, c := range []rueidis.Client{c1, c2} {
		_ = c.Do(ctx, c.B().Ping().Build()).Error()
	}

	twoDead, err := NewRedlock([]rueidis.Client{rueidisClient(t, live.Addr()), c1, c2})
	if err != nil {
		t.Fatal(err)
	}
	defer twoDead.Close()
	_, err = twoDead.TryAcquire(ctx, "r", time.Second)
	if !errors.Is(err, lock.ErrNoQuorum) {
		t.Fatalf("TryAcquire = %v, want ErrNoQuorum", err)
	}
	checkNodeMessage(t, "TryAcquire", err.Error(), "acquire", "node 1", "node 2")

	// The live nodes must answer within the node timeout here: the
	// default (tens of milliseconds) is shorter than a first call takes on
	// a loaded machine with -race (CI saw both live nodes time out, as
	// the go-redis test had), and the dead node's dial is refused at once
	// whatever the timeout.
	oneDead, err := NewRedlock([]rueidis.Client{rueidisClient(t, live.Addr()), rueidisClient(t, other.Addr()), c1},
		lock.WithNodeTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer oneDead.Close()
	lease, err := oneDead.TryAcquire(ctx, "s", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var names lock.RedisNames
	if !oneDead.As(&names) {
		t.Fatal("not a Redis Locker")
	}
	// With the lock gone from one live node, only one node of three holds it.
	if err := live.Client().Del(ctx, names.LockKey("s")).Err(); err != nil {
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
}

// TestDialFailure: the adapter's DialFailure, which Redlock reads to tell
// a node whose call its node timeout or its caller's context cut short,
// is the dial error its latest call met while the server is down, and
// nothing once a call got a reply again.
func TestDialFailure(t *testing.T) {
	ctx := ctxFor(t, time.Minute)
	srv := testenv.StartRedis(t)
	c := newClient(rueidisClient(t, srv.Addr()))
	const src = "return 1"
	sum := sha1.Sum([]byte(src))
	call := func() error { return c.Run(ctx, src, []any{"evalsha", hex.EncodeToString(sum[:]), 0}).Err() }
	if err := call(); err != nil {
		t.Fatal(err)
	}
	if err := c.DialFailure(); err != nil {
		t.Fatalf("DialFailure with the server up = %v", err)
	}
	srv.Kill()
	_ = call() // the end of the open connection
	err := call()
	if err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("a call to a stopped server = %v, want its dial's refusal", err)
	}
	if d := c.DialFailure(); d == nil || d.Error() != err.Error() {
		t.Fatalf("DialFailure = %v, want the call's %v", d, err)
	}
	srv.Restart()
	deadline := time.Now().Add(10 * time.Second)
	for call() != nil {
		if time.Now().After(deadline) {
			t.Fatal("no reply from the restarted server in 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := c.DialFailure(); err != nil {
		t.Fatalf("DialFailure after a reply = %v, want nil", err)
	}
}
