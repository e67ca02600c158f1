package testenv

import (
	"context"
	"strconv"
	"testing"
	"time"
)

func TestSharedServers(t *testing.T) {
	ctx := context.Background()
	c := Redis(t)
	p := Prefix(t)
	if err := c.Set(ctx, p+"k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	pool := Postgres(t)
	var one int
	if err := pool.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("postgres: %v %d", err, one)
	}
	var sp string
	if err := pool.QueryRow(ctx, "SHOW search_path").Scan(&sp); err != nil {
		t.Fatal(err)
	}
	if len(sp) < len("fktest_") {
		t.Fatalf("search_path %q is not the test's schema", sp)
	}
}

func TestPrivateRedisRestartLosesData(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := StartRedis(t)
	c := s.Client()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.Restart()
	n, err := c.Exists(ctx, "k").Result()
	if err != nil {
		// The client's first command after a restart may fail on the old connection.
		n, err = c.Exists(ctx, "k").Result()
	}
	if err != nil || n != 0 {
		t.Fatalf("after restart: exists=%d err=%v, want 0 <nil>", n, err)
	}
}

func TestPrivateCluster(t *testing.T) {
	Slow(t)
	t.Parallel()
	ctx := context.Background()
	s := StartRedisCluster(t)
	c := s.ClusterClient()
	if err := c.Set(ctx, "{a}x", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	err := c.Eval(ctx, "return redis.call('GET', KEYS[1])", []string{"{a}x", "{b}y"}).Err()
	if err == nil {
		t.Fatal("a script over two slots was accepted; the cluster does not check CROSSSLOT")
	}
}

// TestClusterFailover starts three masters with a replica each, kills the
// master of one key and waits for its replica to take over the slot; the
// cluster client follows it.
func TestClusterFailover(t *testing.T) {
	Slow(t)
	t.Parallel()
	ctx := context.Background()
	cl := StartCluster(t, 3, 1)
	c := cl.Client()
	masters := map[string]bool{}
	for i := range 50 {
		m, err := cl.MasterOf("k" + strconv.Itoa(i))
		if err != nil {
			t.Fatal(err)
		}
		masters[m.Addr()] = true
	}
	if len(masters) != 3 {
		t.Fatalf("50 keys landed on %d masters, want 3", len(masters))
	}
	if err := c.Set(ctx, "k", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	old, err := cl.MasterOf("k")
	if err != nil {
		t.Fatal(err)
	}
	old.Kill()
	if err := cl.WaitHealthy(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	now, err := cl.MasterOf("k")
	if err != nil || now == old {
		t.Fatalf("master of k after the kill: %v, %v; want its replica", now, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := c.Set(ctx, "k", "2", 0).Err()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the client did not follow the failover: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
