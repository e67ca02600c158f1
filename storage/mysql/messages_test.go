package mysql_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"

	drv "github.com/go-sql-driver/mysql"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/storage/mysql"
)

// wantOnePrefix fails t unless msg starts with "mysql: " and says it once.
func wantOnePrefix(t *testing.T, what, msg string) {
	t.Helper()
	if !strings.HasPrefix(msg, "mysql: ") || strings.Count(msg, "mysql:") != 1 {
		t.Errorf("%s: %q, want one \"mysql: \" prefix", what, msg)
	}
}

// TestMessagesSayMySQLOnce: a missing guard table, a stale fence and a
// deadlock each say "mysql:" once, wherever the error was wrapped, and still
// match their sentinels.
func TestMessagesSayMySQLOnce(t *testing.T) {
	ctx := context.Background()
	bare := testenv.MySQL(t) // a database of its own, not migrated
	f := fenceOf("r", 1, "h")
	calls := map[string]func() error{
		"InTx": func() error {
			return mysql.InTx(ctx, bare, nil, f, func(context.Context, *sql.Tx) error { return nil })
		},
		"HighWater": func() error { _, err := mysql.HighWater(ctx, bare, "r"); return err },
	}
	for name, call := range calls {
		err := call()
		if !errors.Is(err, mysql.ErrNotMigrated) {
			t.Fatalf("%s without migrations = %v, want ErrNotMigrated", name, err)
		}
		wantOnePrefix(t, name+" without migrations", err.Error())
	}

	ctx, db := setup(t)
	newer, older := fenceOf("s", 9, "new"), fenceOf("s", 3, "old")
	if err := mysql.InTx(ctx, db, nil, newer, func(context.Context, *sql.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	err := mysql.InTx(ctx, db, nil, older, func(context.Context, *sql.Tx) error { return nil })
	wantStale(t, err, newer)
	wantOnePrefix(t, "stale InTx", err.Error())

	// A deadlock reported by a statement of the caller's, as MySQL reports
	// one: error 1213, which the package wraps as retryable.
	err = mysql.InTx(ctx, db, nil, f, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `BEGIN NOT ATOMIC SIGNAL SQLSTATE '40001' SET MYSQL_ERRNO = 1213, MESSAGE_TEXT = 'deadlock'; END`)
		return err
	})
	if !errors.Is(err, mysql.ErrRetryable) {
		t.Fatalf("InTx with a deadlock = %v, want ErrRetryable", err)
	}
	wantOnePrefix(t, "deadlock in InTx", err.Error())
}

// TestTableWithoutItsColumnsSaysHowToAddThem: a Table on a table without
// the fence columns (or, for UpdateVersion, the version column) names the
// missing columns and the ALTER TABLE that adds them, and still matches
// the server's error; a missing column of the caller's is the server's
// to report.
func TestTableWithoutItsColumnsSaysHowToAddThem(t *testing.T) {
	ctx, db := setup(t)
	mustExec(t, ctx, db, `CREATE TABLE bare (id INT PRIMARY KEY, v INT)`)
	mustExec(t, ctx, db, `CREATE TABLE half (id INT PRIMARY KEY, v INT, fence_token BIGINT)`)
	mustExec(t, ctx, db, `INSERT INTO bare VALUES (1, 0)`)
	f := fenceOf("r", 1, "h")
	const server = "Error 1054 (42S22): Unknown column 'fence_token' in 'WHERE'"
	for _, c := range []struct {
		name string
		call func() error
		want string
	}{
		{"Update", func() error { return mysql.Table{Name: "bare", Key: "id"}.Update(ctx, db, f, 1, mysql.Set("v", 1)) },
			`mysql: Table.Update of "bare": table "bare" lacks the columns of the row's fence (missing fence_token, fence_holder); add them with ALTER TABLE ` +
				"`bare` ADD COLUMN `fence_token` BIGINT NULL, ADD COLUMN `fence_holder` VARBINARY(1024) NULL, or name the table's own in Table.Token and Table.Holder: " + server},
		{"Upsert", func() error { return mysql.Table{Name: "half", Key: "id"}.Upsert(ctx, db, f, 1, mysql.Set("v", 1)) },
			`mysql: Table.Upsert into "half": table "half" lacks the columns of the row's fence (missing fence_holder); add it with ALTER TABLE ` +
				"`half` ADD COLUMN `fence_holder` VARBINARY(1024) NULL, or name the table's own in Table.Token and Table.Holder: Error 1054 (42S22): Unknown column 'fence_holder' in 'INSERT INTO'"},
		{"UpdateVersion", func() error {
			_, err := mysql.Table{Name: "bare", Key: "id"}.UpdateVersion(ctx, db, 1, 1, mysql.Set("v", 1))
			return err
		}, `mysql: Table.UpdateVersion of "bare": table "bare" lacks its version column (missing version); add it with ALTER TABLE ` +
			"`bare` ADD COLUMN `version` BIGINT NOT NULL DEFAULT 1, or name the table's own in Table.Version: Error 1054 (42S22): Unknown column 'version' in 'WHERE'"},
	} {
		err := c.call()
		var myErr *drv.MySQLError
		if err == nil || err.Error() != c.want || !errors.As(err, &myErr) || myErr.Number != 1054 {
			t.Errorf("%s:\n got %v\nwant %s", c.name, err, c.want)
		}
	}
	mustExec(t, ctx, db, `CREATE TABLE whole (id INT PRIMARY KEY, v INT, fence_token BIGINT, fence_holder VARBINARY(1024))`)
	err := mysql.Table{Name: "whole", Key: "id"}.Update(ctx, db, f, 1, mysql.Set("nope", 1))
	if err == nil || strings.Contains(err.Error(), "ALTER TABLE") {
		t.Errorf("Update of a missing value column = %v, want the server's own error", err)
	}
}

// TestZeroFenceNamesTheCall: a zero fence (what a caller holds after
// ignoring the error of the call that should have made it) is refused
// before anything is sent, by a message that names the package and the
// call, and matches fence.ErrInvalid.
func TestZeroFenceNamesTheCall(t *testing.T) {
	ctx, db := setup(t)
	var zero fence.Fence
	const reason = "invalid fence: zero Fence: was an error from Acquire or FenceLock ignored?"
	tx, _ := begin(t, ctx, db, sql.LevelRepeatableRead)
	tbl := mysql.Table{Name: "counter", Key: "id"}
	noop := func(context.Context, *sql.Tx) error { return nil }
	for call, run := range map[string]func() error{
		"InTx":         func() error { return mysql.InTx(ctx, db, nil, zero, noop) },
		"Once":         func() error { _, err := mysql.Once(ctx, db, zero, "k", noop); return err },
		"Guard":        func() error { return mysql.Guard(ctx, tx, zero) },
		"GuardAll":     func() error { return mysql.GuardAll(ctx, tx, fenceOf("a", 1, "h"), zero) },
		"Table.Update": func() error { return tbl.Update(ctx, db, zero, 1, mysql.Set("n", 1)) },
		"Table.Upsert": func() error { return tbl.Upsert(ctx, db, zero, 1, mysql.Set("n", 1)) },
	} {
		err := run()
		want := "mysql: " + call + ": " + reason
		if !errors.Is(err, fence.ErrInvalid) || err.Error() != want {
			t.Errorf("%s with a zero fence:\n got %v\nwant %s", call, err, want)
		}
	}
	if n, _ := counter(t, ctx, db); n != 0 {
		t.Fatalf("counter = %d, want 0", n)
	}
}
