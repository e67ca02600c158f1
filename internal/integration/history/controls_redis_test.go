package history

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
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
// older fence. It counts in exposed the writes that went wrong: those made
// after the key's version moved past the one read.
func clientSideSet(ctx context.Context, c *goredis.Client, rkey string, f fence.Fence, expected int64, d string, exposed *atomic.Int64) (int64, error) {
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
	// The test looks again to count a write that goes wrong; the write
	// does not use it.
	now, lookErr := c.HGet(ctx, rkey, "ver").Int64()
	err = c.HSet(ctx, rkey, "v", d, "ver", ver+1, "tok", int64(f.Token), "hold", f.Holder, "res", f.Resource).Err()
	if err == nil && lookErr == nil && now != ver {
		exposed.Add(1)
	}
	return ver + 1, err
}

// freshIDRetries is the go-redis hook of the second negative control: it
// retries a command that met a network error or a timeout, as go-redis
// does, but gives each retry of a write a new write id, as a store without
// the retry record would see it: the retry runs as a new write. It counts in
// resent the commands it sent again so, and in exposed those whose first
// run had already written (its record exists, looked up through direct, a
// client without faults): their resend writes a second time.
type freshIDRetries struct {
	direct          *goredis.Client
	resent, exposed *atomic.Int64
}

func (h freshIDRetries) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h freshIDRetries) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

func (h freshIDRetries) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		err := next(ctx, cmd)
		for range 3 {
			var reply goredis.Error
			if err == nil || errors.As(err, &reply) || ctx.Err() != nil {
				return err
			}
			if old, write := renewWriteID(cmd.Args()); old != "" {
				h.resent.Add(1)
				lctx, cancel := context.WithTimeout(context.Background(), time.Second)
				if n, err := h.direct.Exists(lctx, old).Result(); err == nil && n == 1 && write {
					h.exposed.Add(1)
				}
				cancel()
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
// It returns the record key it replaced, or "" if the command has none, and
// whether the command writes a value: a get (the script's first argument,
// right after the record key) that raised the mark leaves a record too, but
// running it again changes nothing more.
func renewWriteID(args []any) (string, bool) {
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
		write := i+1 < len(args) && fmt.Sprint(args[i+1]) != "get"
		return k, write
	}
	return "", false
}

// TestRedisControlClientSide runs the Redis checker on fenced writes that
// decide in the client between a read and a write: it must reject most
// runs.
func TestRedisControlClientSide(t *testing.T) {
	t.Parallel()
	rejectsMost(t, "client-side read-then-write", func(t *testing.T, b Budget) controlRun {
		res := runRedis(t, b, redisClientSide)
		reportRedis(t, res)
		return controlRun{rejected: res.verdict.Result == porcupine.Illegal, exposed: res.exposed}
	})
}

// TestRedisControlNoRecord runs the Redis checker on writes whose retries
// after a lost reply run as new writes: it must reject most runs.
func TestRedisControlNoRecord(t *testing.T) {
	t.Parallel()
	rejectsMost(t, "writes retried without the retry record", func(t *testing.T, b Budget) controlRun {
		res := runRedis(t, b, redisNoRecord)
		reportRedis(t, res)
		t.Logf("%d writes sent again as new writes, %d of them after their first run had written", res.resent, res.exposed)
		return controlRun{rejected: res.verdict.Result == porcupine.Illegal, exposed: res.exposed}
	})
}

// redisScriptControl runs the Redis checker on the store with one line of
// its fenced script broken (redisBreaks): it must reject most runs.
func redisScriptControl(t *testing.T, name string, variant redisVariant) {
	budgetedOnly(t)
	t.Parallel()
	rejectsMost(t, name, func(t *testing.T, b Budget) controlRun {
		res := runRedis(t, b, variant)
		reportRedis(t, res)
		res.judged.Require(t, "redis control", nil)
		return controlRun{rejected: res.verdict.Result == porcupine.Illegal, exposed: res.exposed}
	})
}

// TestRedisControlTokenGE: the fence rule's token compared by >=, so that a
// fence with the mark's token is admitted whatever its holder.
func TestRedisControlTokenGE(t *testing.T) {
	redisScriptControl(t, "token compared by >=", redisTokenGE)
}

// TestRedisControlFastNoHolder: the fenced script's fast path takes a fence
// with the mark's token for the mark, whatever its holder.
func TestRedisControlFastNoHolder(t *testing.T) {
	redisScriptControl(t, "fast path without the holder compare", redisFastNoHolder)
}

// TestRedisControlFastNoToken: the fenced script's fast path takes a fence
// with the mark's holder for the mark, whatever its token.
func TestRedisControlFastNoToken(t *testing.T) {
	redisScriptControl(t, "fast path without the token compare", redisFastNoToken)
}

// TestRedisControlCASIgnoresExpiry: the compare-and-set script compares the
// expected version with the one stored, not counting the value's expiry
// since, so that a compare-and-set at the version of an expired value is
// admitted.
func TestRedisControlCASIgnoresExpiry(t *testing.T) {
	redisScriptControl(t, "compare-and-set blind to expiry", redisCASIgnoresExpiry)
}
