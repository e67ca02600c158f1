package migrations_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io/fs"
	"strings"
	"testing"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"
	"github.com/pressly/goose/v3"

	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/migrations"
)

// mysqlApplied returns how many times each migration version was recorded
// as applied in the test's database.
func mysqlApplied(t *testing.T, ctx context.Context, db *sql.DB) map[int64]int {
	t.Helper()
	rows, err := db.QueryContext(ctx, "SELECT version_id FROM "+migrations.VersionTable+" WHERE is_applied")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[int64]int{}
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		got[v]++
	}
	return got
}

func checkMySQLAppliedOnce(t *testing.T, ctx context.Context, db *sql.DB) {
	t.Helper()
	names, err := fs.Glob(migrations.MySQLFS, "*.sql")
	if err != nil || len(names) < 2 {
		t.Fatalf("MySQLFS holds %v (%v), want at least 2 SQL files", names, err)
	}
	got := mysqlApplied(t, ctx, db)
	for v := int64(1); v <= int64(len(names)); v++ {
		if got[v] != 1 {
			t.Errorf("version %d applied %d times, want once (all: %v)", v, got[v], got)
		}
	}
}

func TestUpMySQLTwiceIsNoOp(t *testing.T) {
	ctx := testCtx(t)
	db := testenv.MySQL(t)
	if err := migrations.UpMySQL(ctx, db); err != nil {
		t.Fatalf("first UpMySQL: %v", err)
	}
	if _, err := db.ExecContext(ctx, "INSERT INTO fencekit_guard (resource, token, holder, updated_at) VALUES ('r', 7, 'h', UTC_TIMESTAMP(6))"); err != nil {
		t.Fatal(err)
	}
	if err := migrations.UpMySQL(ctx, db); err != nil {
		t.Fatalf("second UpMySQL: %v", err)
	}
	checkMySQLAppliedOnce(t, ctx, db)
	var token int64
	if err := db.QueryRowContext(ctx, "SELECT token FROM fencekit_guard WHERE resource = 'r'").Scan(&token); err != nil || token != 7 {
		t.Fatalf("mark after the second UpMySQL: %d, %v; want 7", token, err)
	}
}

// TestUpMySQLConcurrent starts eight migrations at once on one fresh
// database, as eight processes would: each migration is applied once and
// all succeed. (Under goose's own session locker this failed now and then:
// goose creates its version table before locking, and MySQL commits that
// DDL before the version-0 row is written.)
func TestUpMySQLConcurrent(t *testing.T) {
	ctx := testCtx(t)
	cfg := testenv.MySQLConfig(t)
	dbs := make([]*sql.DB, 8)
	for i := range dbs {
		dbs[i] = testenv.OpenMySQL(t, cfg.Clone())
	}
	start := make(chan struct{})
	errs := make(chan error, len(dbs))
	for _, d := range dbs {
		go func() {
			<-start
			errs <- migrations.UpMySQL(ctx, d)
		}()
	}
	close(start)
	for range dbs {
		if err := <-errs; err != nil {
			t.Fatalf("concurrent UpMySQL: %v", err)
		}
	}
	checkMySQLAppliedOnce(t, ctx, dbs[0])
}

// TestUpMySQLWaitsForTheNamedLock holds the named lock in another session:
// UpMySQL must wait for it, so with a short deadline it fails and creates
// nothing; once the lock is free it succeeds.
func TestUpMySQLWaitsForTheNamedLock(t *testing.T) {
	ctx := testCtx(t)
	db := testenv.MySQL(t)
	holder, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	var got int
	if err := holder.QueryRowContext(ctx, "SELECT GET_LOCK(?, 30)", migrations.MySQLLockName).Scan(&got); err != nil || got != 1 {
		t.Fatalf("GET_LOCK = %d, %v", got, err)
	}
	short, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel()
	if err := migrations.UpMySQL(short, db); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("UpMySQL while the lock is held = %v, want the deadline", err)
	}
	// goose creates its version table before it takes the lock; the
	// migrations themselves must wait.
	var n int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN ('fencekit_guard', 'fencekit_once')").Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d fencekit tables created while the lock was held (%v)", n, err)
	}
	if err := holder.QueryRowContext(ctx, "SELECT RELEASE_LOCK(?)", migrations.MySQLLockName).Scan(&got); err != nil || got != 1 {
		t.Fatalf("RELEASE_LOCK = %d, %v", got, err)
	}
	if err := migrations.UpMySQL(ctx, db); err != nil {
		t.Fatal(err)
	}
	checkMySQLAppliedOnce(t, ctx, db)
}

// TestUpMySQLAfterACrash: MySQL commits DDL at once, so a process can die
// after creating a table and before recording its version. The next
// UpMySQL must still succeed.
func TestUpMySQLAfterACrash(t *testing.T) {
	ctx := testCtx(t)
	db := testenv.MySQL(t)
	if err := migrations.UpMySQL(ctx, db); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "DELETE FROM "+migrations.VersionTable+" WHERE version_id > 0"); err != nil {
		t.Fatal(err)
	}
	if err := migrations.UpMySQL(ctx, db); err != nil {
		t.Fatalf("UpMySQL over tables without version records: %v", err)
	}
	checkMySQLAppliedOnce(t, ctx, db)
}

func TestUpMySQLBadInput(t *testing.T) {
	if err := migrations.UpMySQL(context.Background(), nil); err == nil {
		t.Fatal("UpMySQL(nil) succeeded")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := migrations.UpMySQL(ctx, testenv.MySQL(t)); !errors.Is(err, context.Canceled) {
		t.Fatalf("UpMySQL with a cancelled ctx = %v, want context.Canceled", err)
	}
}

// TestPlainGooseUsesTheMySQLFiles applies MySQLFS with a plain goose
// Provider and the same version table, then UpMySQL applies nothing twice,
// and the Down sections undo everything.
func TestPlainGooseUsesTheMySQLFiles(t *testing.T) {
	ctx := testCtx(t)
	db := testenv.MySQL(t)
	p, err := goose.NewProvider(goose.DialectMySQL, db, migrations.MySQLFS,
		goose.WithTableName(migrations.VersionTable), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if err := migrations.UpMySQL(ctx, db); err != nil {
		t.Fatal(err)
	}
	checkMySQLAppliedOnce(t, ctx, db)
	if _, err := p.DownTo(ctx, 0); err != nil {
		t.Fatalf("down: %v", err)
	}
	var n int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN ('fencekit_guard', 'fencekit_once')").Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d fencekit tables survived goose down (%v)", n, err)
	}
}

// TestUpOnMySQLPointsToUpMySQL: the PostgreSQL migrations run on a MySQL
// database fail with a message that says which call to use, and create
// nothing.
func TestUpOnMySQLPointsToUpMySQL(t *testing.T) {
	ctx := testCtx(t)
	db := testenv.MySQL(t)
	err := migrations.Up(ctx, db)
	const want = "migrations: Up applies fencekit's PostgreSQL migrations, but db is a MySQL or MariaDB database: call migrations.UpMySQL(ctx, db) instead"
	if err == nil || err.Error() != want {
		t.Fatalf("Up on MySQL:\n got %v\nwant %s", err, want)
	}
	var n int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE()").Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d tables created (%v), want none", n, err)
	}
}

// wrappedDriver hides the MySQL driver's type, as instrumenting wrappers
// do.
type wrappedDriver struct{ driver.Driver }

type wrappedConnector struct{ driver.Connector }

func (c wrappedConnector) Driver() driver.Driver { return wrappedDriver{c.Connector.Driver()} }

// TestUpOnWrappedMySQLPointsToUpMySQL: behind a driver wrapper, Up finds
// out from the server that it is MySQL or MariaDB once goose has failed,
// and says to call UpMySQL.
func TestUpOnWrappedMySQLPointsToUpMySQL(t *testing.T) {
	ctx := testCtx(t)
	conn, err := mysqldrv.NewConnector(testenv.MySQLConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(wrappedConnector{conn})
	defer db.Close()
	err = migrations.Up(ctx, db)
	if err == nil || !strings.HasPrefix(err.Error(), "migrations: Up applies fencekit's PostgreSQL migrations, but db is a MySQL or MariaDB database (") ||
		!strings.Contains(err.Error(), "call migrations.UpMySQL(ctx, db) instead") {
		t.Fatalf("Up on a wrapped MySQL driver = %v", err)
	}
}
