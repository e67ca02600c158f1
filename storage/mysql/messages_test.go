package mysql_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"

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
