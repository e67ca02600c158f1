package main

import (
	"bytes"
	"context"
	"database/sql"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/testenv"
	"github.com/fencekit/fencekit/storage/mysql"
)

// testMySQLConfig points a run at a MySQL database and a key prefix of the
// test's own.
func testMySQLConfig(t *testing.T) Config {
	t.Helper()
	opt, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	return Config{
		Store:      storeMySQL,
		MySQLDSN:   testenv.MySQLDSN(t),
		Redis:      *opt,
		LockPrefix: testenv.Prefix(t),
		Instances:  3,
		Winners:    testWinners,
		Users:      200,
		TTL:        200 * time.Millisecond,
		Pause:      true,
	}
}

// TestMySQLOneDrawPerDayDespitePause is TestOneDrawPerDayDespitePause on
// MySQL: one draw, all its winners from the drawer, the paused instance
// refused, and a second run recording nothing.
func TestMySQLOneDrawPerDayDespitePause(t *testing.T) {
	ctx := testContext(t)
	cfg := testMySQLConfig(t)
	for _, day := range []string{"2032-03-01", "2032-03-02"} {
		t.Run(day, func(t *testing.T) {
			cfg.Day, _ = time.Parse(dayLayout, day)
			first, err := Draw(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			drew := instanceWith(first, Drew)
			if first.Draws != 1 || len(drew) != 1 {
				t.Fatalf("%d draws, %d drawers; want 1 and 1: %+v", first.Draws, len(drew), first.Instances)
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
			var got []int64
			for _, w := range d.Winners {
				if w.Token != d.Token {
					t.Errorf("winner %d written by token %d, draw by %d", w.UserID, w.Token, d.Token)
				}
				got = append(got, w.UserID)
			}
			if want := slices.Sorted(slices.Values(drew[0].Chosen)); !slices.Equal(got, want) || len(got) != testWinners {
				t.Fatalf("winners %v, want the drawer's %d choices %v", got, testWinners, want)
			}
			assertStoredMySQL(t, ctx, cfg, day, d.Token)

			again, err := Draw(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if n := len(instanceWith(again, FoundExisting)); n != cfg.Instances {
				t.Fatalf("second run: %d instances found the draw, want all %d: %+v", n, cfg.Instances, again.Instances)
			}
			if !drawEqual(again.Draw, d) {
				t.Fatalf("second run changed the draw: %+v, was %+v", again.Draw, d)
			}
		})
	}
}

// assertStoredMySQL counts rows with SQL of its own and checks the guard's
// mark, as assertStored does for PostgreSQL.
func assertStoredMySQL(t *testing.T, ctx context.Context, cfg Config, day string, token fence.Token) {
	t.Helper()
	db, err := sql.Open("mysql", cfg.MySQLDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var draws, winners, distinct, tokens int
	err = db.QueryRowContext(ctx, `SELECT
    (SELECT COUNT(*) FROM lottery_draws WHERE day = ?),
    (SELECT COUNT(*) FROM lottery_winners WHERE day = ?),
    (SELECT COUNT(DISTINCT user_id) FROM lottery_winners WHERE day = ?),
    (SELECT COUNT(DISTINCT token) FROM lottery_winners WHERE day = ?)`, day, day, day, day).Scan(&draws, &winners, &distinct, &tokens)
	if err != nil {
		t.Fatal(err)
	}
	if draws != 1 || winners != testWinners || distinct != testWinners || tokens != 1 {
		t.Fatalf("stored for %s: %d draws, %d winner rows, %d distinct users, %d tokens; want 1, %d, %d, 1",
			day, draws, winners, distinct, tokens, testWinners, testWinners)
	}
	mark, err := mysql.HighWater(ctx, db, "lottery:"+day)
	if err != nil {
		t.Fatal(err)
	}
	if mark.Token < token {
		t.Fatalf("guard mark %v for %s is below the draw's token %d", mark, day, token)
	}
}

// TestMySQLLockAloneCorruptsTheDraw is the negative control on MySQL: with
// the lock alone, the paused instance's late write adds its winners to the
// day's draw.
func TestMySQLLockAloneCorruptsTheDraw(t *testing.T) {
	ctx := testContext(t)
	cfg := testMySQLConfig(t)
	cfg.Unfenced = true
	cfg.Day, _ = time.Parse(dayLayout, "2032-04-01")
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
		t.Fatalf("control saw no corruption: paused %+v, %d winners from %d tokens; the test cannot see the failure it guards against",
			paused, len(res.Draw.Winners), len(tokens))
	}
	t.Logf("without fencing: %d winner rows from %d holders for one draw", len(res.Draw.Winners), len(tokens))
}

// TestMySQLCommandLine runs the program's flags: -store mysql draws once,
// and an unreachable -mysql exits with status 2 naming the flag.
func TestMySQLCommandLine(t *testing.T) {
	cfg := testMySQLConfig(t)
	var stdout, stderr bytes.Buffer
	args := []string{"-store", "mysql", "-mysql", cfg.MySQLDSN, "-redis", cfg.Redis.Addr, "-pause", "-ttl", "200ms", "-day", "2032-05-01"}
	if code := run(t.Context(), args, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d, stderr %q", code, stderr.String())
	}
	if out := stdout.String(); !strings.Contains(out, "refused as stale") || !strings.Contains(out, "recorded draw for 2032-05-01") || strings.Contains(out, "corrupt") {
		t.Fatalf("output does not show one clean draw with the paused instance refused:\n%s", out)
	}
	stderr.Reset()
	code := run(t.Context(), []string{"-store", "mysql", "-mysql", "root@tcp(127.0.0.1:1)/test"}, &bytes.Buffer{}, &stderr)
	if code != 2 || !strings.Contains(stderr.String(), "-mysql") {
		t.Fatalf("exit %d, stderr %q: want 2 naming -mysql", code, stderr.String())
	}
	stderr.Reset()
	if code := run(t.Context(), []string{"-store", "oracle"}, &bytes.Buffer{}, &stderr); code != 2 || !strings.Contains(stderr.String(), "oracle") {
		t.Fatalf("exit %d, stderr %q: want 2 naming the store", code, stderr.String())
	}
}
