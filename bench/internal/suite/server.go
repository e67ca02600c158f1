package suite

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is a private redis-server on a free loopback port, without
// persistence, so that its command statistics count only the suite's work.
type Server struct {
	Addr  string
	cmd   *exec.Cmd
	dir   string
	admin *redis.Client
}

// StartServer starts redis-server (found on PATH) and waits until it answers.
func StartServer(ctx context.Context) (*Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	dir, err := os.MkdirTemp("", "fencekit-bench-redis-")
	if err != nil {
		return nil, err
	}
	s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), dir: dir}
	s.cmd = exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir)
	if err := s.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("redis-server: %w (is it installed?)", err)
	}
	s.admin = s.Client()
	c := s.admin
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := c.Ping(ctx).Err(); err == nil {
			return s, nil
		} else if time.Now().After(deadline) {
			s.Stop()
			return nil, fmt.Errorf("redis-server on %s: %w", s.Addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Client returns a new go-redis client of the server.
func (s *Server) Client() *redis.Client { return redis.NewClient(&redis.Options{Addr: s.Addr}) }

// Stop kills the server and removes its directory.
func (s *Server) Stop() {
	if s.admin != nil {
		s.admin.Close()
	}
	if s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
	}
	os.RemoveAll(s.dir)
}

// CommandStat is one line of INFO commandstats.
type CommandStat struct {
	Calls int64
	Usec  int64
}

// CommandStats reads INFO commandstats: calls and µs per command name (lower
// case). Commands that scripts call are counted too, under their own names.
func CommandStats(ctx context.Context, c *redis.Client) (map[string]CommandStat, error) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, err
	}
	out := make(map[string]CommandStat)
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		name, rest, ok := strings.Cut(line, ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		var st CommandStat
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "calls":
				st.Calls, _ = strconv.ParseInt(v, 10, 64)
			case "usec":
				st.Usec, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		out[strings.TrimPrefix(name, "cmdstat_")] = st
	}
	return out, sc.Err()
}

// diffStats returns after - before, per command.
func diffStats(before, after map[string]CommandStat) map[string]CommandStat {
	out := make(map[string]CommandStat)
	for k, a := range after {
		b := before[k]
		if d := (CommandStat{a.Calls - b.Calls, a.Usec - b.Usec}); d.Calls != 0 {
			out[k] = d
		}
	}
	return out
}

// Stats reads the server's INFO commandstats.
func (s *Server) Stats(ctx context.Context) (map[string]CommandStat, error) {
	return CommandStats(ctx, s.admin)
}

// RTT is the median time of a PING round trip, over n of them.
func (s *Server) RTT(ctx context.Context, n int) (time.Duration, error) {
	d := make([]time.Duration, 0, n)
	for range n {
		t0 := time.Now()
		if err := s.admin.Ping(ctx).Err(); err != nil {
			return 0, err
		}
		d = append(d, time.Since(t0))
	}
	return percentile(d, 0.5), nil
}

// Version is the server's redis_version.
func (s *Server) Version(ctx context.Context) (string, error) {
	info, err := s.admin.Info(ctx, "server").Result()
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			return v, nil
		}
	}
	return "unknown", nil
}
