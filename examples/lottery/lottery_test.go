package main

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/testenv"
	"github.com/fencekit/fencekit/storage/postgres"
)

const testWinners = 5

// testConfig points a run at a schema and a key prefix of the test's own.
func testConfig(t *testing.T) Config {
	t.Helper()
	opt, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	return Config{
		PostgresURL: testenv.PostgresURL(t),
		Redis:       *opt,
		LockPrefix:  testenv.Prefix(t),
		Instances:   3,
		Winners:     testWinners,
		Users:       200,
		TTL:         200 * time.Millisecond,
		Pause:       true,
	}
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
// days, twice each, and checks the database itself: one draw per day, whose
// winners are exactly the drawer's distinct choices written by one token;
// the paused instance refused; the second run recording nothing.
func TestOneDrawPerDayDespitePause(t *testing.T) {
	ctx := testContext(t)
	cfg := testConfig(t)
	for _, day := range []string{"2031-03-01", "2031-03-02", "2031-03-03"} {
		t.Run(day, func(t *testing.T) {
			cfg.Day, _ = time.Parse(dayLayout, day)
			first, err := Draw(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if first.Draws != 1 {
				t.Fatalf("%d draws recorded, want 1", first.Draws)
			}
			drew := instanceWith(first, Drew)
			if len(drew) != 1 {
				t.Fatalf("%d instances drew, want 1: %+v", len(drew), first.Instances)
			}
			if late := instanceWith(first, LateWrite); len(late) != 0 {
				t.Fatalf("late writes with the fence: %+v", late)
			}
			d := first.Draw
			if d.Token != drew[0].Token || d.Holder != drew[0].Holder || d.Instance != drew[0].ID {
				t.Fatalf("recorded draw %+v is not the drawer's %+v", d, drew[0])
			}
			paused := pausedInstance(t, first)
			if paused.Outcome != RefusedStale || paused.HighWater.Token <= paused.Token {
				t.Fatalf("paused instance %+v: want refused as stale by a newer token", paused)
			}
			if paused.Token >= d.Token {
				t.Fatalf("paused token %d not older than the draw's %d", paused.Token, d.Token)
			}
			var got []int64
			for _, w := range d.Winners {
				if w.Token != d.Token {
					t.Errorf("winner %d written by token %d, draw by %d", w.UserID, w.Token, d.Token)
				}
				got = append(got, w.UserID)
			}
			want := slices.Sorted(slices.Values(drew[0].Chosen))
			if len(got) != testWinners || !slices.Equal(got, slices.Compact(slices.Clone(got))) || !slices.Equal(got, want) {
				t.Fatalf("winners %v, want the drawer's %d distinct choices %v", got, testWinners, want)
			}
			assertStored(t, ctx, cfg, day, d.Token)

			again, err := Draw(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if n := len(instanceWith(again, FoundExisting)); n != cfg.Instances {
				t.Fatalf("re-run: %d of %d instances found the draw: %+v", n, cfg.Instances, again.Instances)
			}
			if again.Draws != 1 || !drawEqual(again.Draw, d) {
				t.Fatalf("re-run changed the draw: %+v, was %+v", again.Draw, d)
			}
			assertStored(t, ctx, cfg, day, d.Token)
		})
	}
}

func drawEqual(a, b Recorded) bool {
	return a.Token == b.Token && a.Holder == b.Holder && a.Instance == b.Instance &&
		a.DrawnAt.Equal(b.DrawnAt) && slices.Equal(a.Winners, b.Winners)
}

// assertStored counts rows with SQL of its own, so the check does not rest
// on the code under test, and checks that the guard's mark is at least the
// draw's token.
func assertStored(t *testing.T, ctx context.Context, cfg Config, day string, token fence.Token) {
	t.Helper()
	conn, err := pgx.Connect(ctx, cfg.PostgresURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var draws, winners, distinct, tokens int
	err = conn.QueryRow(ctx, `SELECT
    (SELECT count(*) FROM lottery_draws WHERE day = $1),
    (SELECT count(*) FROM lottery_winners WHERE day = $1),
    (SELECT count(DISTINCT user_id) FROM lottery_winners WHERE day = $1),
    (SELECT count(DISTINCT token) FROM lottery_winners WHERE day = $1)`, day).Scan(&draws, &winners, &distinct, &tokens)
	if err != nil {
		t.Fatal(err)
	}
	if draws != 1 || winners != testWinners || distinct != testWinners || tokens != 1 {
		t.Fatalf("stored for %s: %d draws, %d winner rows, %d distinct users, %d tokens; want 1, %d, %d, 1",
			day, draws, winners, distinct, tokens, testWinners, testWinners)
	}
	mark, err := postgres.HighWater(ctx, conn, "lottery:"+day)
	if err != nil {
		t.Fatal(err)
	}
	if mark.Token < token {
		t.Fatalf("guard mark %v for %s is below the draw's token %d", mark, day, token)
	}
}

// TestLockAloneCorruptsTheDraw is the negative control: the same job and
// statements with the lock alone. The unique draw key still keeps a second
// draw row out, but the paused instance's late write adds its winners to the
// day's draw. If the control shows no corruption, the test above could not
// have seen one either, and this test fails.
func TestLockAloneCorruptsTheDraw(t *testing.T) {
	ctx := testContext(t)
	cfg := testConfig(t)
	cfg.Unfenced = true
	for _, day := range []string{"2031-04-01", "2031-04-02"} {
		cfg.Day, _ = time.Parse(dayLayout, day)
		res, err := Draw(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		paused := pausedInstance(t, res)
		tokens := map[int64]bool{}
		for _, w := range res.Draw.Winners {
			tokens[int64(w.Token)] = true
		}
		if paused.Outcome != LateWrite || len(res.Draw.Winners) <= testWinners || len(tokens) < 2 {
			t.Fatalf("%s: control saw no corruption: paused %+v, %d winners from %d tokens; the test cannot see the failure it guards against",
				day, paused, len(res.Draw.Winners), len(tokens))
		}
		t.Logf("%s without fencing: %d winner rows from %d holders for one draw", day, len(res.Draw.Winners), len(tokens))
	}
}

// TestLoneInstancePausedStillDraws shows that fencing refuses only writes
// that a newer holder overtook: a lone instance that pauses past its lease,
// with nobody taking over, still records its draw.
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
	if !in.Paused || in.Outcome != Drew || res.Draws != 1 || len(res.Draw.Winners) != testWinners {
		t.Fatalf("lone paused instance %+v, draw %+v: want it paused and drawn", in, res.Draw)
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
	if err != nil || c.Instances != 3 || c.Winners != 5 || c.Users != 300 || c.TTL != 500*time.Millisecond {
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

// TestUnreachableServers checks the exit status and that the message names
// the flag to fix, and that nothing was written when Redis was missing.
func TestUnreachableServers(t *testing.T) {
	var stderr bytes.Buffer
	code := run(t.Context(), []string{"-postgres", "postgres://postgres@127.0.0.1:1/test?sslmode=disable"}, &bytes.Buffer{}, &stderr)
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
}
