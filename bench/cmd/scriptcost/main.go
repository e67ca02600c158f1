// Command scriptcost counts the Redis server's work for one uncontended
// acquire + release: fencekit's own, variants of fencekit's scripts that each
// leave out one duty, the same scripts run as Redis functions (FCALL), the
// floor with a token and the other contenders (see the report). Each runs
// on a private redis-server started under valgrind's callgrind, once with n
// pairs and once with 3n, and the figure is the difference in instructions
// executed divided by 2n: the server's start and end cancel out, and an
// instruction count, unlike a time, does not depend on what else the machine
// is doing.
//
//	go run ./cmd/scriptcost          # in bench/; needs valgrind and redis-server
//
// The variants are fencekit's scripts as they are in ../lock with one piece
// replaced; each replacement must match, or the command fails. They measure,
// they are not locks to use.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/bench/internal/suite"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lock"
)

// A variant is an acquire and a release, run n times on resources that recur
// (as a service's do), each released before the next acquire.
type variant struct {
	name, what string
	pair       func(ctx context.Context, c *redis.Client, resource string) error
}

func main() {
	n := flag.Int("n", 1000, "pairs in the shorter run (the longer has 3n)")
	luaDir := flag.String("lua", "../lock/internal/redisbackend", "fencekit's Redis lock backend, for its scripts")
	only := flag.String("only", "", "run only the variants whose name matches this regular expression")
	flag.StringVar(&keep, "keep", "", "keep callgrind's output of each longer run in this directory, for callgrind_annotate")
	flag.Parse()
	vs, err := variants(*luaDir)
	if err != nil {
		fail(err)
	}
	if *only != "" {
		re, err := regexp.Compile(*only)
		if err != nil {
			fail(fmt.Errorf("-only: %w", err))
		}
		vs = slices.DeleteFunc(vs, func(v variant) bool { return !re.MatchString(v.name) })
	}
	if _, err := exec.LookPath("valgrind"); err != nil {
		fail(errors.New("valgrind not found: install it (Debian: apt-get install valgrind)"))
	}
	fmt.Printf("Redis server instructions per uncontended acquire + release (callgrind, (I(%d) - I(%d)) / %d):\n\n", 3**n, *n, 2**n)
	fmt.Println("| variant | instructions per pair | vs fencekit | what it leaves out |")
	fmt.Println("|---|---|---|---|")
	var base float64
	for i, v := range vs {
		short, err := count(v, *n, "")
		if err != nil {
			fail(fmt.Errorf("%s: %w", v.name, err))
		}
		long, err := count(v, 3**n, keep)
		if err != nil {
			fail(fmt.Errorf("%s: %w", v.name, err))
		}
		per := float64(long-short) / float64(2**n)
		if i == 0 {
			base = per
		}
		fmt.Printf("| %s | %.1fk | %.2f× | %s |\n", v.name, per/1000, per/base, v.what)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "scriptcost:", err)
	os.Exit(1)
}

// keep is the -keep flag.
var keep string

// count starts redis-server under callgrind, runs n pairs of v, stops the
// server and returns the instructions callgrind collected; with keepDir,
// callgrind's output stays there, named for v.
func count(v variant, n int, keepDir string) (int64, error) {
	port, err := freePort()
	if err != nil {
		return 0, err
	}
	dir, err := os.MkdirTemp("", "scriptcost")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	cmd := exec.Command("valgrind", "--tool=callgrind", "--callgrind-out-file="+filepath.Join(dir, "out"),
		"redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir,
		"--hz", "1") // the timer's work grows with the run's length, which valgrind stretches
	var log strings.Builder
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	defer cmd.Process.Kill()
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(port), ReadTimeout: -1, MaxRetries: -1})
	defer c.Close()
	up := false
	// Valgrind starts slowly on a loaded machine.
	for deadline := time.Now().Add(2 * time.Minute); !up && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if conn, err := net.Dial("tcp", c.Options().Addr); err == nil {
			conn.Close()
			up = c.Ping(ctx).Err() == nil
		}
	}
	if !up {
		return 0, fmt.Errorf("redis-server under valgrind did not answer: %s", log.String())
	}
	for i := range n {
		if err := v.pair(ctx, c, "r"+strconv.Itoa(i%64)); err != nil {
			return 0, err
		}
	}
	_ = c.Do(ctx, "shutdown", "nosave").Err() // the connection closes: no reply
	if err := cmd.Wait(); err != nil {
		return 0, fmt.Errorf("%w: %s", err, log.String())
	}
	if keepDir != "" {
		name := regexp.MustCompile(`[^A-Za-z0-9]+`).ReplaceAllString(v.name, "_")
		if err := os.Rename(filepath.Join(dir, "out"), filepath.Join(keepDir, "callgrind.out."+name)); err != nil {
			return 0, err
		}
	}
	m := regexp.MustCompile(`Collected : (\d+)`).FindStringSubmatch(log.String())
	if m == nil {
		return 0, fmt.Errorf("no instruction count in callgrind's output: %s", log.String())
	}
	return strconv.ParseInt(m[1], 10, 64)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

const (
	ttlMS       = 10000
	retentionMS = 600000 // lock.DefaultTokenRetention
)

func variants(dir string) ([]variant, error) {
	read := func(name string) (string, error) {
		b, err := os.ReadFile(filepath.Join(dir, name))
		return string(b), err
	}
	var src = map[string]string{}
	for _, f := range []string{"try_fast.lua", "tokenstate.lua", "try.lua", "release_plain.lua", "handover.lua", "release.lua", "acquire.lua"} {
		s, err := read(f)
		if err != nil {
			return nil, fmt.Errorf("%w (run in bench/, or pass -lua)", err)
		}
		src[f] = s
	}
	replace := func(s, old, new string) (string, error) {
		if !strings.Contains(s, old) {
			return "", fmt.Errorf("%q is no longer in the scripts: update the variant", old)
		}
		return strings.ReplaceAll(s, old, new), nil
	}
	trySrc := src["try_fast.lua"] + src["tokenstate.lua"] + src["try.lua"]
	relSrc := src["release_plain.lua"] + src["tokenstate.lua"] + src["handover.lua"] + src["release.lua"]

	// fencekit's scripts with the arguments the Locker sends.
	scripted := func(try, rel string, relKeys func(k []string) []string, relArgs func(holder string) []any) func(context.Context, *redis.Client, string) error {
		tryS, relS := redis.NewScript(try), redis.NewScript(rel)
		return func(ctx context.Context, c *redis.Client, resource string) error {
			k := keys(resource)
			holder := fence.NewHolder()
			if err := tryS.Run(ctx, c, []string{k[0], k[1], k[3]}, holder, ttlMS, ttlMS+retentionMS).Err(); err != nil {
				return fmt.Errorf("acquire: %w", err)
			}
			n, err := relS.Run(ctx, c, relKeys(k), relArgs(holder)...).Int64()
			if err == nil && n != 1 {
				err = fmt.Errorf("released %d", n)
			}
			return err
		}
	}
	allKeys := func(k []string) []string { return k[:5] }
	fullArgs := func(h string) []any { return []any{h, "p" + strconv.Itoa(retentionMS)} }

	noTag, err := replace(trySrc, "ts .. ' ' .. string.sub(ARGV[1], 1, 8)", "ts")
	if err == nil {
		noTag, err = replace(noTag, "string.match(v, '^(%d+) %S+$')", "string.match(v, '^(%d+)$')")
	}
	if err != nil {
		return nil, err
	}
	noQueue, err := replace(trySrc, "redis.call('EXISTS', KEYS[1], KEYS[3] or KEYS[1])", "redis.call('EXISTS', KEYS[1])")
	if err != nil {
		return nil, err
	}
	// The plain path alone, with only the keys and argument it reads.
	plainRelease := `if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if redis.call('EXISTS', KEYS[2]) == 0 then redis.call('DEL', KEYS[1]) return 1 end
return 0`

	// What the designs weighed and left out would cost at least (see
	// docs/performance.md): each script below is only what such a design
	// runs on the uncontended path, without the writes that would keep its
	// queue flag true, the hand-over, the retry and the bad-input
	// handling, so it is a lower bound, not a lock. The grant takes the
	// queue's presence from the token state it reads anyway and writes the
	// lock with SET NX GET; the release reads the lock and the token state
	// (the flag) with one MGET and declares neither the hand-over's keys nor
	// its arguments; the last grant also writes the token state with SET
	// ... GET in place of its GET and SET.
	flagTry := `local v = redis.call('GET', KEYS[2])
local t = redis.call('TIME')
local ts = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
local d = v and string.match(v, '^(%d+) %S+$')
if not v or (d and (#d < #ts or (#d == #ts and d < ts))) then
  if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET') then
    redis.call('SET', KEYS[2], ts .. ' ' .. string.sub(ARGV[1], 1, 8), 'PX', ARGV[3])
    if not v then return ts .. ' 0' end
    return ts
  end
end
return redis.error_reply('not the uncontended path')`
	flagTrySetGet := `local t = redis.call('TIME')
local ts = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET') then
  local v = redis.call('SET', KEYS[2], ts .. ' ' .. string.sub(ARGV[1], 1, 8), 'PX', ARGV[3], 'GET')
  local d = v and string.match(v, '^(%d+) %S+$')
  if not v then return ts .. ' 0' end
  if d and (#d < #ts or (#d == #ts and d < ts)) then return ts end
end
return redis.error_reply('not the uncontended path')`
	flagRelease := `local v = redis.call('MGET', KEYS[1], KEYS[2])
if v[1] ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1`
	bounded := func(try, rel string, relKeys func(k []string) []string, relArgs func(holder string) []any) func(context.Context, *redis.Client, string) error {
		tryS, relS := redis.NewScript(try), redis.NewScript(rel)
		return func(ctx context.Context, c *redis.Client, resource string) error {
			k := keys(resource)
			holder := fence.NewHolder()
			if err := tryS.Run(ctx, c, k[:2], holder, ttlMS, ttlMS+retentionMS).Err(); err != nil {
				return fmt.Errorf("acquire: %w", err)
			}
			n, err := relS.Run(ctx, c, relKeys(k), relArgs(holder)...).Int64()
			if err == nil && n != 1 {
				err = fmt.Errorf("released %d", n)
			}
			return err
		}
	}
	lockAndState := func(k []string) []string { return k[:2] }
	holderOnly := func(h string) []any { return []any{h} }

	// The same scripts as one library of Redis functions, called with FCALL
	// instead of EVALSHA (loaded once per server, as a Locker would).
	library := "#!lua name=fkscriptcost\n" +
		"redis.register_function('fk_try', function(KEYS, ARGV)\n" + trySrc + "\nend)\n" +
		"redis.register_function('fk_release', function(KEYS, ARGV)\n" + relSrc + "\nend)\n"
	loaded := map[string]bool{}
	functions := func(ctx context.Context, c *redis.Client, resource string) error {
		if addr := c.Options().Addr; !loaded[addr] {
			if err := c.FunctionLoadReplace(ctx, library).Err(); err != nil {
				return fmt.Errorf("FUNCTION LOAD: %w", err)
			}
			loaded[addr] = true
		}
		k := keys(resource)
		holder := fence.NewHolder()
		if err := c.FCall(ctx, "fk_try", []string{k[0], k[1], k[3]}, holder, ttlMS, ttlMS+retentionMS).Err(); err != nil {
			return fmt.Errorf("acquire: %w", err)
		}
		n, err := c.FCall(ctx, "fk_release", k[:5], fullArgs(holder)...).Int64()
		if err == nil && n != 1 {
			err = fmt.Errorf("released %d", n)
		}
		return err
	}

	// A hand-over as the queue makes it: a holder takes the lock, a waiter
	// queues behind it (acquire.lua, refused), the holder's release grants
	// the lock to the waiter and publishes the grant, and the waiter
	// releases. No client subscribes: what a subscriber costs the server is
	// the same for every variant.
	acqS := redis.NewScript(src["tokenstate.lua"] + src["handover.lua"] + src["acquire.lua"])
	tryS, relS := redis.NewScript(trySrc), redis.NewScript(relSrc)
	handOver := func(ctx context.Context, c *redis.Client, resource string) error {
		k := keys(resource)
		holder, waiter := fence.NewHolder(), fence.NewHolder()
		channel := lock.DefaultPrefix + "{" + resource + "}:released"
		if err := tryS.Run(ctx, c, []string{k[0], k[1], k[3]}, holder, ttlMS, ttlMS+retentionMS).Err(); err != nil {
			return fmt.Errorf("acquire: %w", err)
		}
		// The entry lives a minute: under valgrind on a busy machine the
		// release can come seconds after the waiter queued, and a lapsed
		// entry is passed over.
		res, err := acqS.Run(ctx, c, k[:5], waiter, ttlMS, retentionMS, "", 60000, channel, "").Int64Slice()
		if err != nil || len(res) < 1 || res[0] != 0 {
			return fmt.Errorf("queue: %v %w", res, err)
		}
		for _, h := range []string{holder, waiter} {
			n, err := relS.Run(ctx, c, k[:5], fullArgs(h)...).Int64()
			if err == nil && n != 1 {
				err = fmt.Errorf("released %d", n)
			}
			if err != nil {
				return err
			}
		}
		return nil
	}

	vs := []variant{
		{"fencekit (its Locker)", "nothing", contender(suite.Fencekit)},
		{"fencekit's scripts, run bare", "nothing (checks that the variants below are sent as the Locker sends)",
			scripted(trySrc, relSrc, allKeys, fullArgs)},
		{"fencekit's scripts as Redis functions", "nothing: the same scripts called with FCALL instead of EVALSHA",
			functions},
		{"release without hand-over's keys and arguments", "the keys and arguments a release needs only to hand the lock to a waiter in the same script (3 keys and 1 argument)",
			scripted(trySrc, plainRelease, func(k []string) []string { return []string{k[0], k[3]} }, func(h string) []any { return []any{h} })},
		{"token state without the holder's tag", "what lets a client's retry of a grant get the grant's token back",
			scripted(noTag, relSrc, allKeys, fullArgs)},
		{"grant without the look at the queue", "the grant's check that nobody waits (first come, first served)",
			scripted(noQueue, relSrc, allKeys, fullArgs)},
		{"bound: grant with a queue flag in the token state", "its EXISTS of the lock and the queue, and the queue key (SET NX GET for the lock); the flag's upkeep",
			bounded(flagTry, relSrc, allKeys, fullArgs)},
		{"bound: and a release by MGET of lock and flag", "also the release's EXISTS, the hand-over's keys and arguments in the release",
			bounded(flagTry, flagRelease, lockAndState, holderOnly)},
		{"bound: and the token state by SET ... GET", "also the grant's GET of the token state, and the restore of a bad or spent one",
			bounded(flagTrySetGet, flagRelease, lockAndState, holderOnly)},
		{suite.FloorToken + " (the report's)", "all of the above, the give-up and owner branches, and the retry and bad-input handling",
			contender(suite.FloorToken)},
		{"bsm/redislock", "the token (a peer without one)", contender(suite.Redislock)},
		{"go-redsync/redsync", "the token (a peer without one)", contender(suite.Redsync)},
		{"rueidislock", "the token (a peer without one)", contender(suite.Rueidislock)},
		{suite.FloorLua, "the token and the compare before the delete", contender(suite.FloorLua)},
		{suite.Floor, "the scripts", contender(suite.Floor)},
		{"hand-over cycle (not a pair)", "nothing: a grant, a waiter queued, a release that hands the lock to it, its release",
			handOver},
	}
	return vs, nil
}

// keys are fencekit's keys of resource under the default prefix.
func keys(resource string) []string {
	var k []string
	for _, s := range []string{":lock", ":token", ":holds", ":queue", ":waiting"} {
		k = append(k, lock.DefaultPrefix+"{"+resource+"}"+s)
	}
	return k
}

// contender runs the report's contender name, one per server.
func contender(name string) func(context.Context, *redis.Client, string) error {
	lockers := map[string]suite.Locker{}
	return func(ctx context.Context, c *redis.Client, resource string) error {
		addr := c.Options().Addr
		l := lockers[addr]
		if l == nil {
			var err error
			if l, err = suite.NewLocker(name, addr, "scriptcost:"); err != nil {
				return err
			}
			lockers[addr] = l
		}
		h, err := l.TryAcquire(ctx, resource)
		if err != nil {
			return err
		}
		return h.Release(ctx)
	}
}
