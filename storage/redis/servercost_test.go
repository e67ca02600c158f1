package redis

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/internal/harness/testenv"
)

// TestServerCostPerCall measures the server's own time per call (INFO
// commandstats, usec_per_call) of fenced Get and Set against plain GET and
// SET, on a private server. It runs only when FENCEKIT_SERVERCOST is set to
// the number of calls of each kind:
//
//	FENCEKIT_SERVERCOST=20000 go test -run TestServerCostPerCall -v ./storage/redis/
func TestServerCostPerCall(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("FENCEKIT_SERVERCOST"))
	if n <= 0 {
		t.Skip("set FENCEKIT_SERVERCOST to the number of calls to measure")
	}
	ctx := context.Background()
	srv := testenv.StartRedis(t)
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	s, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Preload(ctx); err != nil {
		t.Fatal(err)
	}
	f, v := fen(1, "bench"), benchValue()
	if _, err := s.FencedSet(ctx, f, "fenced", v); err != nil {
		t.Fatal(err)
	}
	if err := c.Set(ctx, "plain", v, 0).Err(); err != nil {
		t.Fatal(err)
	}
	phases := []struct {
		name, cmd string
		run       func() error
	}{
		{"plain GET", "get", func() error { return c.Get(ctx, "plain").Err() }},
		{"fenced Get", "evalsha", func() error { _, err := s.FencedGet(ctx, f, "fenced"); return err }},
		{"plain SET", "set", func() error { return c.Set(ctx, "plain", v, 0).Err() }},
		{"fenced Set", "evalsha", func() error { _, err := s.FencedSet(ctx, f, "fenced", v); return err }},
	}
	for _, ph := range phases {
		if err := c.ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		for range n {
			if err := ph.run(); err != nil {
				t.Fatal(err)
			}
		}
		info, err := c.Info(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		var inner []string
		for _, line := range strings.Split(info, "\n") {
			line = strings.TrimSpace(line)
			name, rest, ok := strings.Cut(line, ":")
			if !ok || !strings.HasPrefix(name, "cmdstat_") {
				continue
			}
			if name == "cmdstat_config|resetstat" {
				continue
			}
			if name == "cmdstat_"+ph.cmd {
				t.Logf("%s: %s", ph.name, line)
				continue
			}
			// Commands the script ran, per call.
			calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
			k, _ := strconv.Atoi(calls)
			inner = append(inner, fmt.Sprintf("%s %.2f", strings.TrimPrefix(name, "cmdstat_"), float64(k)/float64(n)))
		}
		if len(inner) > 0 {
			t.Logf("%s: commands per call inside the script: %s", ph.name, strings.Join(inner, ", "))
		}
	}
}
