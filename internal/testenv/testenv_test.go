package testenv

import (
	"context"
	"testing"
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
