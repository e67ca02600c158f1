package main

import (
	"bytes"
	"context"
	"errors"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/storage/postgres"
)

const testWinners = 5

// testStore is one database the tests run the job on: a configuration of
// the test's own, and a check of what is stored that uses SQL of its own,
// so that it does not rest on the code under test.
type testStore struct {
	name   string
	config func(t *testing.T) Config
	stored func(t *testing.T, ctx context.Context, cfg Config, day string) stored
}

// stored is what a day holds, counted by a test.
type stored struct {
	winners, users, tokens int         // winner rows, distinct users, distinct tokens
	records                int         // completion records for the day's key
	recordToken            fence.Token // the record's token, if any
	mark                   fence.Token // the guard's mark for the day's resource
}

var testStores = []testStore{
	{"postgres", testConfig, storedPostgres},
	{"pgsql", testPgsqlConfig, storedPostgres},
	{"mysql", testMySQLConfig, storedMySQL},
	{"postgres-only", testPostgresOnlyConfig, storedPostgres},
	{"mysql-only", testMySQLOnlyConfig, storedMySQL},
}

// testPostgresOnlyConfig is testConfig with the lock in PostgreSQL too:
// no Redis at all.
func testPostgresOnlyConfig(t *testing.T) Config {
	t.Helper()
	cfg := testConfig(t)
	cfg.Lock, cfg.Redis, cfg.LockPrefix = lockPostgres, redis.Options{}, ""
	return cfg
}

// testConfig points a run at a schema and a key prefix of the test's own.
func testConfig(t *testing.T) Config {
	t.Helper()
	return Config{
		PostgresURL: testenv.PostgresURL(t),
		Redis:       testRedis(t),
		LockPrefix:  testenv.Prefix(t),
		Instances:   3,
		Winners:     testWinners,
		Users:       200,
		TTL:         200 * time.Millisecond,
		Pause:       true,
	}
}

func testRedis(t *testing.T) redis.Options {
	opt, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	return *opt
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func instanceWith(res Result, o Outcome) []Instance {
	var out []Instance
	for _, in := range res.Instances {
		if in.Outcome == o {
			out = append(out, in)
		}
	}
	return out
}

func pausedInstance(t *testing.T, res Result) Instance {
	t.Helper()
	for _, in := range res.Instances {
		if in.Paused {
			return in
		}
	}
	t.Fatalf("no instance paused: %+v", res.Instances)
	return Instance{}
}

// TestOneDrawPerDayDespitePause runs the job with a forced pause on several
// days, twice each, on each store, and checks the database itself: one
// completion record per day, naming the drawer; winners that are exactly
// the drawer's distinct choices, written by its token; the paused instance
// refused; the second run finding the day drawn by that token and changing
// nothing.
func TestOneDrawPerDayDespitePause(t *testing.T) {
	for _, st := range testStores {
		t.Run(st.name, func(t *testing.T) {
			ctx := testContext(t)
			cfg := st.config(t)
			for _, day := range []string{"2031-03-01", "2031-03-02"} {
				t.Run(day, func(t *testing.T) {
					cfg.Day, _ = time.Parse(dayLayout, day)
					first, err := Draw(ctx, cfg)
					if err != nil {
						t.Fatal(err)
					}
					drew := instanceWith(first, Drew)
					if len(drew) != 1 || first.Draws != 1 {
						t.Fatalf("%d instances drew, %d draws stored; want 1 and 1: %+v", len(drew), first.Draws, first.Instances)
					}
					rec := first.Record
					if rec == nil || rec.Token != drew[0].Token || rec.HolderMark != fence.HolderMark(drew[0].Holder) || first.Drawer != drew[0].ID {
						t.Fatalf("completion record %+v (drawer %d) is not the drawer's %+v", rec, first.Drawer, drew[0])
					}
					paused := pausedInstance(t, first)
					if paused.Outcome != RefusedStale || paused.HighWater.Token <= paused.Token {
						t.Fatalf("paused instance %+v: want refused as stale by a newer token", paused)
					}
					var got []int64
					for _, w := range first.Winners {
						if w.Token != rec.Token {
							t.Errorf("winner %d written by token %d, the draw by %d", w.UserID, w.Token, rec.Token)
						}
						got = append(got, w.UserID)
					}
					want := slices.Sorted(slices.Values(drew[0].Chosen))
					if len(got) != testWinners || !slices.Equal(got, slices.Compact(slices.Clone(got))) || !slices.Equal(got, want) {
						t.Fatalf("winners %v, want the drawer's %d distinct choices %v", got, testWinners, want)
					}
					wantStored(t, st.stored(t, ctx, cfg, day), rec.Token)

					again, err := Draw(ctx, cfg)
					if err != nil {
						t.Fatal(err)
					}
					for _, in := range again.Instances {
						if in.Outcome != FoundExisting || in.FoundBy != rec.Token {
							t.Fatalf("second run: instance %+v; want every one to find the day drawn by token %d", in, rec.Token)
						}
					}
					if again.Record == nil || *again.Record != *rec || !slices.Equal(again.Winners, first.Winners) || again.Drawer != 0 {
						t.Fatalf("second run changed the day: %+v, was %+v", again, first)
					}
					wantStored(t, st.stored(t, ctx, cfg, day), rec.Token)
				})
			}
		})
	}
}

func wantStored(t *testing.T, s stored, token fence.Token) {
	t.Helper()
	if s.winners != testWinners || s.users != testWinners || s.tokens != 1 || s.records != 1 || s.recordToken != token {
		t.Fatalf("stored %+v; want %d winner rows of %d users from 1 token, and 1 record of token %d", s, testWinners, testWinners, token)
	}
	if s.mark < token {
		t.Fatalf("guard mark %d is below the draw's token %d", s.mark, token)
	}
}

func storedPostgres(t *testing.T, ctx context.Context, cfg Config, day string) stored {
	t.Helper()
	conn, err := pgx.Connect(ctx, cfg.PostgresURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var s stored
	err = conn.QueryRow(ctx, `SELECT
    (SELECT count(*) FROM lottery_day_winners WHERE day = $1),
    (SELECT count(DISTINCT user_id) FROM lottery_day_winners WHERE day = $1),
    (SELECT count(DISTINCT token) FROM lottery_day_winners WHERE day = $1),
    (SELECT count(*) FROM fencekit_once WHERE key = 'lottery-draw:' || $1),
    (SELECT coalesce(max(token), 0) FROM fencekit_once WHERE key = 'lottery-draw:' || $1)`, day).
		Scan(&s.winners, &s.users, &s.tokens, &s.records, &s.recordToken)
	if err != nil {
		t.Fatal(err)
	}
	mark, err := postgres.HighWater(ctx, conn, "lottery:"+day)
	if err != nil {
		t.Fatal(err)
	}
	s.mark = mark.Token
	return s
}

// TestLockAloneCorruptsTheDraw is the negative control: the same job with
// the lock alone, no fence and no completion record. The paused instance
// found the day not drawn before its pause, and its late draw adds its
// winners to the day's. If the control shows no corruption, the test above
// could not have seen one either, and this test fails.
func TestLockAloneCorruptsTheDraw(t *testing.T) {
	for _, st := range testStores {
		t.Run(st.name, func(t *testing.T) {
			ctx := testContext(t)
			cfg := st.config(t)
			cfg.Unfenced = true
			cfg.Day, _ = time.Parse(dayLayout, "2031-04-01")
			res, err := Draw(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			paused := pausedInstance(t, res)
			if paused.Outcome != Drew || len(res.Winners) <= testWinners || res.Draws < 2 || res.Record != nil {
				t.Fatalf("control saw no corruption: paused %+v, %d winners from %d draws, record %+v; the test cannot see the failure it guards against",
					paused, len(res.Winners), res.Draws, res.Record)
			}
			t.Logf("without fence or record: %d winner rows from %d draws for one day", len(res.Winners), res.Draws)
		})
	}
}

// TestLoneInstancePausedStillDraws shows that fencing refuses only writes
// that a newer holder overtook: a lone instance that pauses past its lease,
// with nobody taking over, still draws.
func TestLoneInstancePausedStillDraws(t *testing.T) {
	ctx := testContext(t)
	cfg := testConfig(t)
	cfg.Instances = 1
	cfg.Day, _ = time.Parse(dayLayout, "2031-05-01")
	res, err := Draw(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	in := res.Instances[0]
	if !in.Paused || in.Outcome != Drew || res.Draws != 1 || res.Drawer != 1 || len(res.Winners) != testWinners {
		t.Fatalf("lone paused instance %+v, result %+v: want it paused and drawn", in, res)
	}
}

func TestConfigValidation(t *testing.T) {
	valid := Config{PostgresURL: "postgres://x", Redis: redis.Options{Addr: "x:1"}, Day: time.Now()}
	tests := []struct {
		name   string
		change func(*Config)
		want   string
	}{
		{"empty url", func(c *Config) { c.PostgresURL = "" }, "PostgreSQL URL"},
		{"empty dsn", func(c *Config) { c.Store = storeMySQL }, "MySQL DSN"},
		{"unknown store", func(c *Config) { c.Store = "oracle" }, "oracle"},
		{"empty redis", func(c *Config) { c.Redis.Addr = "" }, "Redis address"},
		{"no day", func(c *Config) { c.Day = time.Time{} }, "no day"},
		{"negative instances", func(c *Config) { c.Instances = -1 }, "instances"},
		{"negative winners", func(c *Config) { c.Winners = -2 }, "winners"},
		{"negative users", func(c *Config) { c.Users = -3 }, "users"},
		{"short lease", func(c *Config) { c.TTL = time.Microsecond }, "shorter than 1ms"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := valid
			tt.change(&c)
			// The servers named are unreachable: an error other than the
			// configuration one would mean something was sent.
			_, err := Draw(t.Context(), c)
			if !errors.Is(err, errConfig) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Draw = %v, want a configuration error naming %q", err, tt.want)
			}
		})
	}
	c, err := valid.normalised()
	if err != nil || c.Instances != 3 || c.Winners != 5 || c.Users != 300 || c.TTL != 500*time.Millisecond || c.Store != storePostgres {
		t.Fatalf("defaults: %+v, %v", c, err)
	}
}

func TestTooFewUsers(t *testing.T) {
	ctx := testContext(t)
	cfg := testConfig(t)
	cfg.Users, cfg.Winners = 3, 4
	cfg.Day, _ = time.Parse(dayLayout, "2031-06-01")
	_, err := Draw(ctx, cfg)
	if !errors.Is(err, errConfig) || !strings.Contains(err.Error(), "only 3 users") {
		t.Fatalf("Draw = %v, want a configuration error about users", err)
	}
}

func TestCancelledContext(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	c := Config{PostgresURL: "postgres://x", Redis: redis.Options{Addr: "x:1"}, Day: time.Now()}
	if _, err := Draw(ctx, c); !errors.Is(err, context.Canceled) {
		t.Fatalf("Draw = %v, want context.Canceled", err)
	}
}

// TestCommandLine runs the program as a user would: -h says in one line
// what it shows and exits 0; a paused run draws once and says who drew; a
// second run says the day was found drawn, and by which token.
func TestCommandLine(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run(t.Context(), []string{"-h"}, &stdout, &stderr); code != 0 {
		t.Fatalf("-h: exit %d, want 0", code)
	}
	first, _, _ := strings.Cut(stderr.String(), "\n")
	if !strings.HasPrefix(first, "lottery: ") || !strings.Contains(stderr.String(), "go run ./examples/lottery") ||
		!strings.Contains(stderr.String(), "-unfenced") || !strings.Contains(stderr.String(), "(default \"postgres://postgres@127.0.0.1:5432/test\")") {
		t.Fatalf("-h printed:\n%s", stderr.String())
	}

	cfg := testConfig(t)
	args := []string{"-postgres", cfg.PostgresURL, "-redis", cfg.Redis.Addr, "-pause", "-ttl", "200ms", "-day", "2031-07-01"}
	stdout.Reset()
	if code := run(t.Context(), args, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d, stderr %q", code, stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{"refused as stale (lost to token", "completion record lottery-draw:2031-07-01: token", "5 winners stored for 2031-07-01"} {
		if !strings.Contains(out, want) || strings.Contains(out, "corrupt") {
			t.Fatalf("output does not show one clean draw (%q):\n%s", want, out)
		}
	}
	stdout.Reset()
	if code := run(t.Context(), args, &stdout, &stderr); code != 0 {
		t.Fatalf("second run: exit %d, stderr %q", code, stderr.String())
	}
	found := regexp.MustCompile(`(?m)^instance \d: token \d+: found the day drawn by token \d+$`)
	if out := stdout.String(); len(found.FindAllString(out, -1)) != 3 || !strings.Contains(out, "(an earlier run)") {
		t.Fatalf("second run does not say the day was drawn, by which token:\n%s", out)
	}

	stdout.Reset()
	args = []string{"-postgres", cfg.PostgresURL, "-redis", cfg.Redis.Addr, "-pause", "-ttl", "200ms", "-unfenced"}
	if code := run(t.Context(), args, &stdout, &stderr); code != 0 {
		t.Fatalf("-unfenced: exit %d, stderr %q", code, stderr.String())
	}
	if out := stdout.String(); !strings.Contains(out, "draws a day no earlier run has drawn") || !strings.Contains(out, "the draw is corrupt") {
		t.Fatalf("-unfenced output does not show the corrupt draw:\n%s", out)
	}
}

// TestUnreachableServers checks the exit status and that the message names
// the flag to fix, and that nothing was written when Redis was missing.
func TestUnreachableServers(t *testing.T) {
	var stderr bytes.Buffer
	code := run(t.Context(), []string{"-postgres", "postgres://postgres@127.0.0.1:1/test"}, &bytes.Buffer{}, &stderr)
	if code != 2 || !strings.Contains(stderr.String(), "-postgres") {
		t.Fatalf("exit %d, stderr %q: want 2 naming -postgres", code, stderr.String())
	}

	pg := testenv.PostgresURL(t)
	stderr.Reset()
	code = run(t.Context(), []string{"-postgres", pg, "-redis", "127.0.0.1:1"}, &bytes.Buffer{}, &stderr)
	if code != 2 || !strings.Contains(stderr.String(), "-redis") {
		t.Fatalf("exit %d, stderr %q: want 2 naming -redis", code, stderr.String())
	}
	conn, err := pgx.Connect(t.Context(), pg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(t.Context())
	var tables int
	if err := conn.QueryRow(t.Context(), `SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()`).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 0 {
		t.Fatalf("%d tables created although Redis was unreachable", tables)
	}

	stderr.Reset()
	if code := run(t.Context(), []string{"-day", "tomorrow"}, &bytes.Buffer{}, &stderr); code != 2 || !strings.Contains(stderr.String(), "-day") {
		t.Fatalf("exit %d, stderr %q: want 2 naming -day", code, stderr.String())
	}
	stderr.Reset()
	if code := run(t.Context(), []string{"-nosuchflag"}, &bytes.Buffer{}, &stderr); code != 2 {
		t.Fatalf("a bad flag: exit %d, want 2", code)
	}
}
