package election_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/election"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
)

// TestElectionOnCluster runs on a Redis Cluster: the scripts touch only
// the election's slot, and new leaders are announced with SPUBLISH.
func TestElectionOnCluster(t *testing.T) {
	testenv.Slow(t)
	srv := testenv.StartRedisCluster(t)
	c := srv.ClusterClient()
	ea := newElection(t, newLocker(t, c, "el:"), "clustered")
	eb := newElection(t, newLocker(t, c, "el:"), "clustered")
	watch := newElection(t, newLocker(t, c, "el:"), "clustered")
	// The observer's subscription is sharded: count it with PUBSUB SHARDNUMSUB.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := watch.Observe(ctx)
	for deadline := time.Now().Add(10 * time.Second); c.PubSubShardNumSub(ctx, electionKeys(watch).Channel).Val()[electionKeys(watch).Channel] < 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("observer not subscribed (sharded) after 10s")
		}
	}
	a := mustCampaign(t, ea, "a")
	if l := <-ch; l.Value != "a" || l.Token != a.Fence().Token {
		t.Fatalf("observed %+v, want a", l)
	}
	bc := campaignAsync(ctx, eb, "b")
	time.Sleep(50 * time.Millisecond)
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	ob := <-bc
	if ob.err != nil {
		t.Fatal(ob.err)
	}
	if l := <-ch; l.Value != "b" || l.Token != ob.term.Fence().Token {
		t.Fatalf("observed %+v, want b", l)
	}
	_ = ob.term.Resign(ctx)
}

// TestElectionOnRedlock runs on three independent servers: the leader
// record is written on every node and read from a quorum.
func TestElectionOnRedlock(t *testing.T) {
	testenv.Slow(t)
	redis.SetLogger(quietLogger{}) // the stopped node's failed dials
	var clients []redis.UniversalClient
	var servers []*testenv.RedisServer
	for range 3 {
		s := testenv.StartRedis(t)
		servers = append(servers, s)
		c := s.Client()
		if err := c.Ping(context.Background()).Err(); err != nil { // a warm connection
			t.Fatal(err)
		}
		clients = append(clients, c)
	}
	redlock := func() *lock.Locker {
		// A node timeout long enough for a loaded machine's delays.
		l, err := lock.NewRedlock(clients, lock.WithPrefix("el:"), lock.WithNodeTimeout(500*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(l.Close)
		return l
	}
	ttl := election.WithTTL(2 * time.Second) // far above the node timeout
	ea, eb := newElection(t, redlock(), "quorum", ttl), newElection(t, redlock(), "quorum", ttl)
	watch := newElection(t, redlock(), "quorum", ttl)
	ctx := context.Background()
	a := mustCampaign(t, ea, "a")
	if got, err := watch.Leader(ctx); err != nil || got.Value != "a" {
		t.Fatalf("Leader = %+v, %v", got, err)
	}
	// One node down: a quorum still answers.
	servers[2].Kill()
	if got, err := watch.Leader(ctx); err != nil || got.Value != "a" {
		t.Fatalf("Leader with a node down = %+v, %v", got, err)
	}
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	b := mustCampaign(t, eb, "b")
	if got, err := watch.Leader(ctx); err != nil || got.Value != "b" || got.Token != b.Fence().Token || got.Token <= a.Fence().Token {
		t.Fatalf("Leader after hand-over = %+v, %v", got, err)
	}
	_ = b.Resign(ctx)
	if _, err := watch.Leader(ctx); !errors.Is(err, election.ErrNoLeader) {
		t.Fatalf("Leader after the last resignation: %v", err)
	}
}

// quietLogger drops go-redis's log lines about failed dials to a server a
// test stopped on purpose.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}
