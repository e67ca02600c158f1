package history

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	goredis "github.com/redis/go-redis/v9"
)

// storeScriptDir holds the Redis store's Lua sources, read by the broken
// variants below as the store embeds them.
const storeScriptDir = "../../../storage/redis"

// brokenScript is a Redis store script with one line changed: the store's
// own source, as it sends it, with old replaced by new.
type brokenScript struct {
	sha  string // the SHA1 of the store's script, which EVALSHA names
	src  string // the store's script, which EVAL sends
	with string // the broken script
}

// breakScript builds the store's script from its files (in the order the
// store joins them) and changes it: it fails t if old is not found exactly
// once, so that a control never runs the sound script unknowingly.
func breakScript(t testing.TB, files []string, old, new string) brokenScript {
	t.Helper()
	var b strings.Builder
	for _, f := range files {
		src, err := os.ReadFile(filepath.Join(storeScriptDir, f))
		if err != nil {
			t.Fatalf("broken variant: %v", err)
		}
		b.Write(src)
	}
	src := b.String()
	if n := strings.Count(src, old); n != 1 {
		t.Fatalf("broken variant: %q found %d times in %v, want once: the store's script changed, update the control", old, n, files)
	}
	sum := sha1.Sum([]byte(src))
	return brokenScript{sha: hex.EncodeToString(sum[:]), src: src, with: strings.Replace(src, old, new, 1)}
}

// fencedFiles is the fenced script, as storage/redis/scripts.go joins it;
// casFiles the compare-and-set script.
var (
	fencedFiles = []string{"fenced_fast.lua", "value.lua", "fenced.lua"}
	casFiles    = []string{"value.lua", "cas.lua"}
)

// scriptSwap is a go-redis hook that runs broken scripts in place of the
// store's: a command that names one of the store's scripts (EVALSHA of its
// SHA1, or EVAL of its text) is sent as EVAL of its broken one. It counts
// the commands it changed in swapped, so that a control can tell its
// variant ran at all.
type scriptSwap struct {
	broken  []brokenScript
	swapped *atomic.Int64
}

func (h scriptSwap) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h scriptSwap) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		h.swap(cmd)
		return next(ctx, cmd)
	}
}

func (h scriptSwap) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		for _, cmd := range cmds {
			h.swap(cmd)
		}
		return next(ctx, cmds)
	}
}

func (h scriptSwap) swap(cmd goredis.Cmder) {
	args := cmd.Args()
	if len(args) < 2 {
		return
	}
	name, _ := args[0].(string)
	body, _ := args[1].(string)
	for _, b := range h.broken {
		if strings.EqualFold(name, "evalsha") && body == b.sha || strings.EqualFold(name, "eval") && body == b.src {
			args[0], args[1] = "eval", b.with
			h.swapped.Add(1)
			return
		}
	}
}
