package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const redisServerHow = "install redis-server (Debian: apt-get install redis-server) or set FENCEKIT_REDIS_SERVER to its path"

// RedisServer is a private redis-server process on a free loopback port, for
// tests that kill, restart, flush or cluster Redis. It keeps nothing on disk
// (no RDB, no AOF), so a restart loses every key, as a real restart without
// persistence does.
type RedisServer struct {
	t       testing.TB
	bin     string
	dir     string
	port    int
	cluster bool
	member  bool     // a node of a multi-node cluster: slots come from redis-cli
	extra   []string // more redis-server arguments

	mu     sync.Mutex
	proc   *os.Process
	exited chan struct{} // closed when proc has been reaped
}

// StartRedis starts a private redis-server and stops it when t ends.
func StartRedis(t testing.TB) *RedisServer { return startRedis(t, false) }

// StartRedisCluster starts a private redis-server in cluster mode that owns
// all 16384 slots: a one-node cluster. Scripts and multi-key commands on it
// are checked for CROSSSLOT exactly as on a larger cluster.
func StartRedisCluster(t testing.TB) *RedisServer { return startRedis(t, true) }

func startRedis(t testing.TB, cluster bool) *RedisServer {
	t.Helper()
	return startRedisWith(t, cluster, false, nil)
}

func startRedisWith(t testing.TB, cluster, member bool, extra []string) *RedisServer {
	t.Helper()
	bin := os.Getenv("FENCEKIT_REDIS_SERVER")
	if bin == "" {
		bin = "redis-server"
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		unavailable(t, "redis-server binary", redisServerHow, err)
	}
	// A port found free may be taken by another process before the server
	// binds it (and a cluster node binds a second one, its bus, at port +
	// 10000): a start that fails so is tried again on other ports.
	var s *RedisServer
	for try := 1; ; try++ {
		port, err := freeRedisPort(cluster)
		if err != nil {
			t.Fatalf("testenv: free port: %v", err)
		}
		s = &RedisServer{t: t, bin: path, dir: t.TempDir(), port: port, cluster: cluster, member: member, extra: extra}
		err = s.start()
		if err == nil {
			break
		}
		if try == 5 || !strings.Contains(err.Error(), "Address already in use") {
			t.Fatalf("testenv: start redis-server: %v", err)
		}
	}
	t.Cleanup(func() { s.Kill() })
	if cluster && !member {
		s.assignSlots()
	}
	return s
}

// Addr returns host:port.
func (s *RedisServer) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// URL returns a redis:// URL for the server.
func (s *RedisServer) URL() string { return "redis://" + s.Addr() + "/0" }

// Client returns a new client of the server, closed when the test ends. Its
// retries are off so that tests see faults as they happen.
func (s *RedisServer) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, DialTimeout: time.Second})
	s.t.Cleanup(func() { _ = c.Close() })
	return c
}

// ClusterClient returns a cluster client of a server started with
// [StartRedisCluster], closed when the test ends.
func (s *RedisServer) ClusterClient() *redis.ClusterClient {
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{s.Addr()}})
	s.t.Cleanup(func() { _ = c.Close() })
	return c
}

// Kill stops the server with SIGKILL and waits for it to exit. Killing a
// stopped server does nothing.
func (s *RedisServer) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return
	}
	_ = s.proc.Signal(syscall.SIGKILL)
	<-s.exited
	s.proc = nil
}

// Restart kills the server if it runs and starts it again on the same port,
// empty. Like Flush, it may be called from any goroutine: a failure marks
// the test failed (t.Errorf) rather than stopping it.
func (s *RedisServer) Restart() {
	s.t.Helper()
	s.Kill()
	if err := s.start(); err != nil {
		s.t.Errorf("testenv: restart redis-server: %v", err)
		return
	}
	if s.cluster && !s.member {
		s.assignSlots()
	}
}

// Flush deletes every key on the server (FLUSHALL): Redis losing its data
// while it keeps running.
func (s *RedisServer) Flush() {
	s.t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr()})
	defer c.Close()
	if err := c.FlushAll(context.Background()).Err(); err != nil {
		s.t.Errorf("testenv: flushall: %v", err)
	}
}

func (s *RedisServer) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	args := []string{
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir,
		"--daemonize", "no", "--logfile", "",
	}
	if s.cluster {
		_ = os.Remove(s.dir + "/nodes.conf")
		args = append(args, "--cluster-enabled", "yes", "--cluster-config-file", s.dir+"/nodes.conf")
	}
	args = append(args, s.extra...)
	cmd := exec.Command(s.bin, args...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return fmt.Errorf("redis-server exited: %v: %s", waitErr, out.String())
		default:
		}
		if pingRedis(s.URL()) == nil {
			s.proc, s.exited = cmd.Process, exited
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = cmd.Process.Kill()
	<-exited
	return errors.New("redis-server did not answer within 10s: " + out.String())
}

func (s *RedisServer) assignSlots() {
	s.t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr()})
	defer c.Close()
	ctx := context.Background()
	if err := c.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err(); err != nil {
		s.t.Errorf("testenv: cluster addslotsrange: %v", err)
		return
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		info, err := c.ClusterInfo(ctx).Result()
		if err == nil && strings.Contains(info, "cluster_state:ok") {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.t.Error("testenv: one-node cluster did not reach cluster_state:ok")
}

// freeRedisPort returns a free port for a redis-server; for a cluster node,
// one whose cluster bus port (the port + 10000) is a port and free too.
func freeRedisPort(cluster bool) (int, error) {
	for range 100 {
		port, err := freePort()
		if err != nil || !cluster {
			return port, err
		}
		if port+10000 > 65535 {
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10000))
		if err != nil {
			continue
		}
		_ = l.Close()
		return port, nil
	}
	return 0, errors.New("no port whose cluster bus port is free too")
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
