package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const redisCLIHow = "install redis-tools (Debian: apt-get install redis-tools) or set FENCEKIT_REDIS_CLI to its path"

// ClusterNodeTimeout is the cluster-node-timeout of a [StartCluster]
// cluster: how long a master may be silent before the others consider it
// failed and its replica is promoted. Short, so that a failover takes
// seconds, not tens of them.
const ClusterNodeTimeout = 500 * time.Millisecond

// Cluster is a private Redis Cluster of several masters, each with
// replicas, made from redis-server processes on free loopback ports and
// joined with redis-cli --cluster create. Nothing is kept on disk.
type Cluster struct {
	t     testing.TB
	Nodes []*RedisServer
}

// StartCluster starts masters·(1+replicas) redis-server processes in
// cluster mode, joins them into a cluster of masters masters with replicas
// replicas each, waits until every node reports cluster_state:ok and every
// replica is in sync, and stops every process when t ends. It needs at
// least three masters, as redis-cli does.
func StartCluster(t testing.TB, masters, replicas int) *Cluster {
	t.Helper()
	cli := os.Getenv("FENCEKIT_REDIS_CLI")
	if cli == "" {
		cli = "redis-cli"
	}
	cliPath, err := exec.LookPath(cli)
	if err != nil {
		unavailable(t, "redis-cli binary", redisCLIHow, err)
	}
	c := &Cluster{t: t}
	extra := []string{"--cluster-node-timeout", strconv.Itoa(int(ClusterNodeTimeout / time.Millisecond))}
	args := []string{"--cluster", "create"}
	for range masters * (1 + replicas) {
		s := startRedisWith(t, true, true, extra)
		c.Nodes = append(c.Nodes, s)
		args = append(args, s.Addr())
	}
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	out, err := exec.Command(cliPath, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("testenv: redis-cli --cluster create: %v: %s", err, out)
	}
	if err := c.WaitHealthy(30 * time.Second); err != nil {
		t.Fatalf("testenv: new cluster: %v", err)
	}
	return c
}

// ClusterStateReload is how often a [Cluster.Client] reloads the slot map.
// go-redis reloads it on a MOVED reply or after ClusterStateReloadInterval
// (60s by default); a dead master answers nothing, so only the interval
// moves the client to its promoted replica.
const ClusterStateReload = time.Second

// Client returns a cluster client that knows every node, closed when the
// test ends. It keeps go-redis's retries and redirects, as applications do,
// and reloads the slot map every [ClusterStateReload], so that it follows a
// failover.
func (c *Cluster) Client() *redis.ClusterClient {
	addrs := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		addrs[i] = n.Addr()
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, DialTimeout: time.Second, ClusterStateReloadInterval: ClusterStateReload})
	c.t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// node returns the server at addr, or nil.
func (c *Cluster) node(addr string) *RedisServer {
	for _, n := range c.Nodes {
		if n.Addr() == addr {
			return n
		}
	}
	return nil
}

// MasterOf returns the node that serves key's slot now, asking the live
// nodes.
func (c *Cluster) MasterOf(key string) (*RedisServer, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var lastErr error
	for _, n := range c.Nodes {
		rc := redis.NewClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1, DialTimeout: time.Second})
		slot, err := rc.ClusterKeySlot(ctx, key).Result()
		var masterOf func(int64) string
		if err == nil {
			masterOf, err = SlotMasters(ctx, rc)
		}
		_ = rc.Close()
		if err != nil {
			lastErr = err
			continue
		}
		if m := c.node(masterOf(slot)); m != nil {
			return m, nil
		}
		return nil, fmt.Errorf("slot %d of %q has no known master", slot, key)
	}
	return nil, fmt.Errorf("no node answered: %v", lastErr)
}

// WaitHealthy polls until every running node reports cluster_state:ok,
// sees as many masters with slots as the cluster has running, and every
// running replica's link to its master is up.
func (c *Cluster) WaitHealthy(within time.Duration) error {
	deadline := time.Now().Add(within)
	var why string
	for time.Now().Before(deadline) {
		if why = c.unhealthy(); why == "" {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("not healthy within %v: %s", within, why)
}

// unhealthy says what is not yet right, or "".
func (c *Cluster) unhealthy() string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, n := range c.Nodes {
		if !n.running() {
			continue
		}
		rc := redis.NewClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1, DialTimeout: time.Second})
		info, err := rc.ClusterInfo(ctx).Result()
		var repl string
		if err == nil {
			repl, err = rc.Info(ctx, "replication").Result()
		}
		_ = rc.Close()
		switch {
		case err != nil:
			return n.Addr() + ": " + err.Error()
		case !strings.Contains(info, "cluster_state:ok"):
			return n.Addr() + ": cluster_state not ok"
		case strings.Contains(repl, "role:slave") && !strings.Contains(repl, "master_link_status:up"):
			return n.Addr() + ": replica not in sync"
		}
	}
	return ""
}

func (s *RedisServer) running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc != nil
}

// SlotMasters asks a cluster node which master serves each slot (CLUSTER
// SHARDS) and returns a function from a slot to its master's host:port, or
// "" for a slot no online master serves.
func SlotMasters(ctx context.Context, c interface {
	ClusterShards(ctx context.Context) *redis.ClusterShardsCmd
}) (func(slot int64) string, error) {
	shards, err := c.ClusterShards(ctx).Result()
	if err != nil {
		return nil, err
	}
	return func(slot int64) string {
		for _, sh := range shards {
			for _, r := range sh.Slots {
				if r.Start > slot || slot > r.End {
					continue
				}
				for _, n := range sh.Nodes {
					if n.Role == "master" && n.Health == "online" {
						return net.JoinHostPort(n.IP, strconv.FormatInt(n.Port, 10))
					}
				}
			}
		}
		return ""
	}, nil
}

// MoveSlot moves the slot of key, with its keys, from the master that
// serves it to another running master, as a resharding does: the target
// imports it, the source migrates it, its keys go over in MIGRATE calls
// (each moves its keys at once, with their expiry), and then every running
// node is told the slot's new master. Meanwhile the source answers ASK
// for a key it no longer has and TRYAGAIN for a call whose keys are split
// between the two; a client that follows redirects sees no key lost. It
// returns the source and the target.
func (c *Cluster) MoveSlot(ctx context.Context, key string) (from, to *RedisServer, err error) {
	from, err = c.MasterOf(key)
	if err != nil {
		return nil, nil, err
	}
	src := redis.NewClient(&redis.Options{Addr: from.Addr(), MaxRetries: -1, DialTimeout: time.Second})
	defer src.Close()
	slot, err := src.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		return nil, nil, err
	}
	shards, err := src.ClusterShards(ctx).Result()
	if err != nil {
		return nil, nil, err
	}
	for _, sh := range shards {
		for _, n := range sh.Nodes {
			addr := net.JoinHostPort(n.IP, strconv.FormatInt(n.Port, 10))
			if n.Role == "master" && n.Health == "online" && addr != from.Addr() && c.node(addr) != nil && to == nil {
				to = c.node(addr)
			}
		}
	}
	if to == nil {
		return nil, nil, fmt.Errorf("no other running master to move slot %d to", slot)
	}
	dst := redis.NewClient(&redis.Options{Addr: to.Addr(), MaxRetries: -1, DialTimeout: time.Second})
	defer dst.Close()
	srcID, err := src.Do(ctx, "CLUSTER", "MYID").Text()
	if err != nil {
		return nil, nil, err
	}
	dstID, err := dst.Do(ctx, "CLUSTER", "MYID").Text()
	if err != nil {
		return nil, nil, err
	}
	if err := dst.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID).Err(); err != nil {
		return nil, nil, fmt.Errorf("importing: %w", err)
	}
	if err := src.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID).Err(); err != nil {
		return nil, nil, fmt.Errorf("migrating: %w", err)
	}
	host, port, _ := net.SplitHostPort(to.Addr())
	for {
		keys, err := src.ClusterGetKeysInSlot(ctx, int(slot), 100).Result()
		if err != nil {
			return nil, nil, err
		}
		if len(keys) == 0 {
			break
		}
		args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		if err := src.Do(ctx, args...).Err(); err != nil && !strings.Contains(err.Error(), "NOKEY") {
			return nil, nil, fmt.Errorf("migrate: %w", err)
		}
	}
	// The target first, then the source (which then redirects with MOVED
	// rather than ASK), then the others.
	for _, n := range append([]*RedisServer{to, from}, c.Nodes...) {
		if !n.running() {
			continue
		}
		rc := redis.NewClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1, DialTimeout: time.Second})
		err := rc.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", dstID).Err()
		_ = rc.Close()
		if err != nil && (n == to || n == from) {
			return nil, nil, fmt.Errorf("setslot node on %s: %w", n.Addr(), err)
		}
	}
	return from, to, nil
}

// Failover kills the master that serves key's slot with SIGKILL, calls
// killed (if not nil) once it has exited, and waits until another node
// serves the slot (its replica, promoted after [ClusterNodeTimeout]) and
// the running nodes report the cluster healthy. The killed node stays
// down: its replica was promoted, and it would come back empty. It
// returns the killed node.
func (c *Cluster) Failover(ctx context.Context, key string, killed func()) (*RedisServer, error) {
	victim, err := c.MasterOf(key)
	if err != nil {
		return nil, err
	}
	victim.Kill()
	if killed != nil {
		killed()
	}
	for ctx.Err() == nil {
		if m, err := c.MasterOf(key); err == nil && m != victim && c.unhealthy() == "" {
			return victim, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return victim, ctx.Err()
}
