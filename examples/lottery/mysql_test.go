package main

import (
	"bytes"
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/storage/mysql"
)

// testMySQLConfig points a run at a MySQL database and a key prefix of the
// test's own.
func testMySQLConfig(t *testing.T) Config {
	t.Helper()
	return Config{
		Store:      storeMySQL,
		MySQLDSN:   testenv.MySQLDSN(t),
		Redis:      testRedis(t),
		LockPrefix: testenv.Prefix(t),
		Instances:  3,
		Winners:    testWinners,
		Users:      200,
		TTL:        200 * time.Millisecond,
		Pause:      true,
	}
}

// testMySQLOnlyConfig is testMySQLConfig with the lock in MySQL too
// (lock/mysqllock): no Redis at all.
func testMySQLOnlyConfig(t *testing.T) Config {
	t.Helper()
	cfg := testMySQLConfig(t)
	cfg.Lock, cfg.Redis, cfg.LockPrefix = lockMySQL, redis.Options{}, ""
	return cfg
}

// storedMySQL counts what the day holds, as storedPostgres does.
func storedMySQL(t *testing.T, ctx context.Context, cfg Config, day string) stored {
	t.Helper()
	db, err := sql.Open("mysql", cfg.MySQLDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	key := "lottery-draw:" + day
	var s stored
	err = db.QueryRowContext(ctx, "SELECT\n"+
		"    (SELECT COUNT(*) FROM lottery_day_winners WHERE day = ?),\n"+
		"    (SELECT COUNT(DISTINCT user_id) FROM lottery_day_winners WHERE day = ?),\n"+
		"    (SELECT COUNT(DISTINCT token) FROM lottery_day_winners WHERE day = ?),\n"+
		"    (SELECT COUNT(*) FROM fencekit_once WHERE `key` = ?),\n"+
		"    (SELECT COALESCE(MAX(token), 0) FROM fencekit_once WHERE `key` = ?)", day, day, day, key, key).
		Scan(&s.winners, &s.users, &s.tokens, &s.records, &s.recordToken)
	if err != nil {
		t.Fatal(err)
	}
	mark, err := mysql.HighWater(ctx, db, "lottery:"+day)
	if err != nil {
		t.Fatal(err)
	}
	s.mark = mark.Token
	return s
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
	if out := stdout.String(); !strings.Contains(out, "refused as stale") || !strings.Contains(out, "completion record lottery-draw:2032-05-01") || strings.Contains(out, "corrupt") {
		t.Fatalf("output does not show one clean draw with the paused instance refused:\n%s", out)
	}
	// MariaDB alone: the lock too (no -redis; the Redis address given is
	// not reachable, so a run that touched Redis would fail).
	stdout.Reset()
	stderr.Reset()
	args = []string{"-store", "mysql", "-lock", "mysql", "-mysql", cfg.MySQLDSN, "-redis", "127.0.0.1:1", "-pause", "-ttl", "200ms", "-day", "2032-05-02"}
	if code := run(t.Context(), args, &stdout, &stderr); code != 0 {
		t.Fatalf("MySQL alone: exit %d, stderr %q", code, stderr.String())
	}
	if out := stdout.String(); !strings.Contains(out, "refused as stale") || !strings.Contains(out, "completion record lottery-draw:2032-05-02") || strings.Contains(out, "corrupt") {
		t.Fatalf("MySQL alone: output does not show one clean draw with the paused instance refused:\n%s", out)
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
