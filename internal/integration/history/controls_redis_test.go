package history

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	mrand "math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	goredis "github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
)

// clientSideSet is the broken fenced write of the first negative control:
// it reads the key's mark and version, decides by the fence rule in the
// client, and then writes, in two round trips. Another holder can be
// admitted between the read and the write, and is then overwritten by an
// older fence.
func clientSideSet(ctx context.Context, c *goredis.Client, rkey string, f fence.Fence, expected int64, d string) (int64, error) {
	vals, err := c.HMGet(ctx, rkey, "ver", "tok", "hold").Result()
	if err != nil {
		return 0, err
	}
	str := func(i int) string { s, _ := vals[i].(string); return s }
	ver, _ := strconv.ParseInt(str(0), 10, 64)
	if tok, err := strconv.ParseInt(str(1), 10, 64); err == nil {
		mark := fence.Fence{Resource: f.Resource, Token: fence.Token(tok), Holder: str(2)}
		if !fence.Admits(mark, f) {
			return 0, &fence.StaleError{Fence: f, HighWater: mark}
		}
	}
	if expected >= 0 && expected != ver {
		return 0, &fence.ConflictError{Key: rkey, Expected: expected, Actual: ver}
	}
	// A client pays a round trip between its read and its write, and may be
	// slow to send the write: up to 10 ms here.
	time.Sleep(time.Duration(mrand.IntN(10_000)) * time.Microsecond)
	err = c.HSet(ctx, rkey, "v", d, "ver", ver+1, "tok", int64(f.Token), "hold", f.Holder, "res", f.Resource).Err()
	return ver + 1, err
}

// freshIDRetries is the go-redis hook of the second negative control: it
// retries a command that met a network error or a timeout, as go-redis
// does, but gives each retry of a write a new write id, as a store without
// the retry record would see it: the retry runs as a new write.
type freshIDRetries struct{}

func (freshIDRetries) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (freshIDRetries) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

func (freshIDRetries) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		err := next(ctx, cmd)
		for range 3 {
			var reply goredis.Error
			if err == nil || errors.As(err, &reply) || ctx.Err() != nil {
				return err
			}
			if renewWriteID(cmd.Args()) {
				doubled.Add(1)
			}
			cmd.SetErr(nil)
			time.Sleep(8 * time.Millisecond)
			err = next(ctx, cmd)
		}
		return err
	}
}

// renewWriteID gives a store script's command a retry record of its own: it
// replaces the call's record key ("{tag}fkr:<id>", among the keys) by a new
// one in the same slot, so that the resend finds no record of the first run
// and runs as a new write, as it would in a store without retry records.
func renewWriteID(args []any) bool {
	for i, a := range args {
		k, ok := a.(string)
		if !ok || !strings.HasPrefix(k, "{") {
			continue
		}
		tag, _, found := strings.Cut(k, "}fkr:")
		if !found {
			continue
		}
		var b [8]byte
		_, _ = rand.Read(b[:])
		args[i] = tag + "}fkr:control" + hex.EncodeToString(b[:])
		return true
	}
	return false
}

// doubled counts the writes that freshIDRetries sent again as new writes.
var doubled atomic.Int64

// TestRedisControlClientSide runs the Redis checker on fenced writes that
// decide in the client between a read and a write: it must reject most
// runs.
func TestRedisControlClientSide(t *testing.T) {
	t.Parallel()
	rejectsMost(t, "client-side read-then-write", func(t *testing.T, b Budget) bool {
		res := runRedis(t, b, redisClientSide)
		reportRedis(t, b, res)
		return res.verdict.Result == porcupine.Illegal
	})
}

// TestRedisControlNoRecord runs the Redis checker on writes whose retries
// after a lost reply run as new writes: it must reject most runs.
func TestRedisControlNoRecord(t *testing.T) {
	t.Parallel()
	rejectsMost(t, "writes retried without the retry record", func(t *testing.T, b Budget) bool {
		before := doubled.Load()
		res := runRedis(t, b, redisNoRecord)
		reportRedis(t, b, res)
		t.Logf("%d writes sent again as new writes", doubled.Load()-before)
		return res.verdict.Result == porcupine.Illegal
	})
}
