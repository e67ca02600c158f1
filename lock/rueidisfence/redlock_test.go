package rueidisfence

import (
	"errors"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/internal/harness/workload"
	"github.com/fencekit/fencekit/lock"
	fkredis "github.com/fencekit/fencekit/storage/redis"
)

// TestRedlock holds locks on three private Redis masters through rueidis
// clients: grants on a quorum with rising tokens, the lock held while one
// node is gone, refused with lock.ErrNoQuorum once two are; and the
// lost-update proof on it (fenced: nothing lost; the plain lock, the
// negative control, loses updates).
func TestRedlock(t *testing.T) {
	ctx := ctxFor(t, 2*time.Minute)
	srvs := []*testenv.RedisServer{testenv.StartRedis(t), testenv.StartRedis(t), testenv.StartRedis(t)}
	var clients []rueidis.Client
	for _, s := range srvs {
		clients = append(clients, rueidisClient(t, s.Addr()))
	}
	l, err := NewRedlock(clients)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var n lock.RedisNames
	if !l.As(&n) || n.Quorum() != 2 {
		t.Fatalf("not a Redlock Locker of quorum 2")
	}

	c := testenv.Redis(t)
	prefix := testenv.Prefix(t)
	st, err := fkredis.New(c, fkredis.WithPrefix(prefix+"data:"))
	if err != nil {
		t.Fatal(err)
	}
	counter := &workload.RedisCounter{Client: c, Store: st, PlainPrefix: prefix + "plain:"}
	for _, mode := range []workload.Mode{workload.Fenced, workload.Plain} {
		res, err := workload.Run(ctx, workload.Config{
			Locker: l, Counter: counter, Mode: mode, TTL: 50 * time.Millisecond,
			Resources: []string{"rl-" + mode.String()}, Duration: 1500 * time.Millisecond,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Log(res)
		switch {
		case mode == workload.Fenced && (!res.Safe() || res.Acked < 10 || res.Stale == 0):
			t.Errorf("fenced run on Redlock: %v (want nothing lost, some writes refused as stale, 10 acknowledged)", res)
		case mode == workload.Plain && res.Lost == 0:
			t.Errorf("negative control: the plain run lost nothing: %v", res)
		}
	}

	var last fence.Token
	grant := func() error {
		lease, err := l.TryAcquire(ctx, "r", time.Second)
		if err != nil {
			return err
		}
		if tok := lease.Fence().Token; tok <= last {
			t.Errorf("token %d after %d", tok, last)
		} else {
			last = tok
		}
		return lease.Release(ctx)
	}
	if err := grant(); err != nil {
		t.Fatal(err)
	}
	srvs[0].Kill()
	if err := grant(); err != nil {
		t.Fatalf("with one node of three gone: %v", err)
	}
	srvs[1].Kill()
	if err := grant(); !errors.Is(err, lock.ErrNoQuorum) {
		t.Fatalf("with two nodes of three gone: %v, want ErrNoQuorum", err)
	}
}
