package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const redisHow = "start Redis on 127.0.0.1:6379, set FENCEKIT_TEST_REDIS=redis://host:port/db, or run a Docker engine"

var sharedRedis struct {
	once sync.Once
	url  string
	err  error
}

// RedisURL returns the URL of the shared Redis server, skipping (or failing)
// t when none can be had. Tests must confine themselves to keys under their
// own [Prefix] and never flush it.
func RedisURL(t testing.TB) string {
	t.Helper()
	sharedRedis.once.Do(func() {
		sharedRedis.url, sharedRedis.err = findRedis()
	})
	if sharedRedis.err != nil {
		unavailable(t, "Redis", redisHow, sharedRedis.err)
	}
	return sharedRedis.url
}

// Redis returns a client of the shared Redis server, closed when t ends.
func Redis(t testing.TB) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(RedisURL(t))
	if err != nil {
		t.Fatalf("testenv: bad Redis URL: %v", err)
	}
	c := redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Prefix returns a key prefix unique to this test, ending in ':', and deletes
// every key under it on the shared server when t ends.
func Prefix(t testing.TB) string {
	t.Helper()
	p := "fktest:" + randomID() + ":"
	url := RedisURL(t)
	t.Cleanup(func() {
		opt, err := redis.ParseURL(url)
		if err != nil {
			return
		}
		c := redis.NewClient(opt)
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// Braces are escaped so that hash-tagged keys ({resource}) match.
		iter := c.Scan(ctx, 0, strings.NewReplacer("{", `\{`, "}", `\}`).Replace(p)+"*", 500).Iterator()
		for iter.Next(ctx) {
			c.Del(ctx, iter.Val())
		}
	})
	return p
}

func findRedis() (string, error) {
	return findServer("redis", "FENCEKIT_TEST_REDIS", "redis://127.0.0.1:6379/0", pingRedis)
}

func pingRedis(url string) error {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return fmt.Errorf("parse %s: %w", url, err)
	}
	opt.DialTimeout = time.Second
	opt.MaxRetries = -1
	c := redis.NewClient(opt)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	return c.Ping(ctx).Err()
}

func randomID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
