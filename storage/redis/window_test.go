package redis

import (
	"errors"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
)

// scripter is a client whose options the store cannot read.
type scripter struct{ goredis.Scripter }

// TestRetryWindowFromClientOptions checks that the default retry window is
// the client's own retry horizon, read from its options, and that a shorter
// window is refused: go-redis's defaults may resend a command about 232 s
// after its first run, far past one minute.
func TestRetryWindowFromClientOptions(t *testing.T) {
	t.Parallel()
	const addr = "127.0.0.1:1" // New sends nothing
	client := func(o *goredis.Options) *goredis.Client {
		o.Addr = addr
		c := goredis.NewClient(o)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	cluster := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: []string{addr}})
	t.Cleanup(func() { _ = cluster.Close() })
	tuned := client(&goredis.Options{
		MaxRetries: 2, MaxRetryBackoff: 100 * time.Millisecond, PoolTimeout: time.Second,
		DialTimeout: time.Second, DialerRetries: 1, ReadTimeout: time.Second, WriteTimeout: time.Second,
	})
	tests := []struct {
		name   string
		client goredis.Scripter
		want   time.Duration
	}{
		// 3 × (5 s read + 1 s backoff + 6 s pool + 5 × 5 s dial + 4 × 100 ms
		// + 5 s dial + 3 × 10 s handshake + 5 s write) = 232.2 s.
		{"Client with go-redis's defaults", client(&goredis.Options{}), 233 * time.Second},
		{"ClusterClient with go-redis's defaults", cluster, 233 * time.Second},
		// 2 × (1 + 0.1 + 1 + 1 + 1 + 3 × 2 + 1) s = 22.2 s.
		{"Client with its own timeouts", tuned, 23 * time.Second},
		{"Client without retries", client(&goredis.Options{MaxRetries: -1}), MinRetryWindow},
		{"client whose options cannot be read", scripter{client(&goredis.Options{})}, DefaultRetryWindow},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(tt.client)
			if err != nil {
				t.Fatal(err)
			}
			if s.retryWindow != tt.want {
				t.Fatalf("default retry window %v; want %v", s.retryWindow, tt.want)
			}
			shorter := tt.want - time.Second
			_, err = New(tt.client, WithRetryWindow(shorter))
			switch {
			case tt.want == MinRetryWindow:
			case tt.want == DefaultRetryWindow:
				if err != nil {
					t.Fatalf("a window for a client whose options cannot be read: %v; want it accepted", err)
				}
			case !errors.Is(err, fence.ErrInvalid) || !strings.Contains(err.Error(), "retry horizon"):
				t.Fatalf("New with a %v window = %v; want an error matching fence.ErrInvalid naming the retry horizon", shorter, err)
			}
		})
	}
	// A client that retries without a read timeout has no horizon.
	for _, o := range []*goredis.Options{{ReadTimeout: -1}, {WriteTimeout: -1}, {DialTimeout: -1}} {
		if _, err := New(client(o)); !errors.Is(err, fence.ErrInvalid) || !strings.Contains(err.Error(), "disabled") {
			t.Fatalf("New on a client retrying without a bound = %v; want an error matching fence.ErrInvalid", err)
		}
	}
}
