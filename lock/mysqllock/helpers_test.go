package mysqllock

import (
	"context"
	"database/sql"
	"io"
	"log"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
	"github.com/fencekit/fencekit/migrations"
)

// migratedConfig creates a database of t's own (dropped when t ends), with
// the migrations applied, and returns its driver configuration.
func migratedConfig(t testing.TB) *mysql.Config {
	t.Helper()
	cfg := testenv.MySQLConfig(t)
	db := testenv.OpenMySQL(t, cfg.Clone())
	if err := migrations.UpMySQL(ctxFor(t, 60*time.Second), db); err != nil {
		t.Fatalf("migrations: %v", err)
	}
	return cfg
}

// migrated is a *sql.DB on a migrated database of t's own.
func migrated(t testing.TB) *sql.DB {
	t.Helper()
	return testenv.OpenMySQL(t, migratedConfig(t))
}

// newLocker is a Locker of New on db, closed when t ends.
func newLocker(t testing.TB, db *sql.DB, opts ...lock.Option) *lock.Locker {
	t.Helper()
	l, err := New(db, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l
}

func ctxFor(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// serverMicros is the server's clock in µs.
func serverMicros(t testing.TB, db *sql.DB) int64 {
	t.Helper()
	var us int64
	if err := db.QueryRow(`SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))`).Scan(&us); err != nil {
		t.Fatal(err)
	}
	return us
}

// The driver logs every connection a KILL or a proxy broke; the tests
// break many on purpose.
func init() { _ = mysql.SetLogger(log.New(io.Discard, "", 0)) }
