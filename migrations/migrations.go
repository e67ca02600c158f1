package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"reflect"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed *.sql
var embedded embed.FS

// FS holds fencekit's goose SQL migrations at its root (00001_*.sql, ...).
// It is read-only and safe for concurrent use.
var FS fs.FS = embedded

// VersionTable is the goose version table [Up] records fencekit's migrations
// in. It lives in the first schema of the connection's search_path.
const VersionTable = "fencekit_db_version"

// LockID is the PostgreSQL session advisory lock key that [Up] holds while it
// migrates. It differs from goose's default key, so that fencekit's migrations
// neither wait for nor block the application's own goose runs.
const LockID int64 = 0x66656e63656b6974 // "fencekit" in ASCII

// Up applies every migration in [FS] that db has not applied yet, in order,
// each in its own transaction. Concurrent calls, from this process or others,
// serialise on the advisory lock [LockID]: each migration is applied once and
// every caller returns nil once the schema is current. When nothing is
// pending, Up changes nothing.
//
// ctx bounds the whole run, including waiting for the lock (which otherwise
// gives up after five minutes). db must be a PostgreSQL database opened with a
// database/sql driver such as github.com/jackc/pgx/v5/stdlib; on a MySQL or
// MariaDB database Up changes nothing and returns an error that says to call
// [UpMySQL].
func Up(ctx context.Context, db *sql.DB) error {
	if db == nil {
		return errors.New("migrations: nil *sql.DB")
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	if isMySQLDriver(db) {
		return errMySQL("")
	}
	p, err := newProvider(db)
	if err != nil {
		return err
	}
	if _, err := p.Up(ctx); err != nil {
		if v, ok := mySQLVersion(ctx, db); ok {
			return fmt.Errorf("%w: %w", errMySQL(v), err)
		}
		return fmt.Errorf("migrations: up: %w", err)
	}
	return nil
}

// errMySQL is Up's refusal of a MySQL or MariaDB database (version, when
// known, is the server's).
func errMySQL(version string) error {
	if version != "" {
		version = " (" + version + ")"
	}
	return fmt.Errorf("migrations: Up applies fencekit's PostgreSQL migrations, but db is a MySQL or MariaDB database%s: call migrations.UpMySQL(ctx, db) instead", version)
}

// mySQLDriverPkg is the package of the MySQL driver's type. It is named,
// not imported, so that importing this package registers no MySQL driver.
const mySQLDriverPkg = "github.com/go-sql-driver/mysql"

// isMySQLDriver reports whether db was opened with the MySQL driver.
func isMySQLDriver(db *sql.DB) bool { return driverPkg(db) == mySQLDriverPkg }

// driverPkg is the package of db's driver's type.
func driverPkg(db *sql.DB) string {
	t := reflect.TypeOf(db.Driver())
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil {
		return ""
	}
	return t.PkgPath()
}

// mySQLVersion asks a database on which the PostgreSQL migrations failed
// for its version, and reports it when the server is MySQL or MariaDB
// (behind a driver wrapper that isMySQLDriver cannot see through).
// PostgreSQL's version() starts with "PostgreSQL"; MySQL's and MariaDB's
// are a bare number, MariaDB's naming itself.
func mySQLVersion(ctx context.Context, db *sql.DB) (string, bool) {
	var v string
	if err := db.QueryRowContext(ctx, "SELECT version()").Scan(&v); err != nil {
		return "", false
	}
	if strings.Contains(v, "MariaDB") || (v != "" && v[0] >= '0' && v[0] <= '9') {
		return v, true
	}
	return "", false
}

// UpPool is [Up] for programs that hold a pgx pool rather than a *sql.DB:
// it applies the pending migrations over pool's connections and leaves pool
// open. ctx bounds the whole run, as for [Up].
func UpPool(ctx context.Context, pool *pgxpool.Pool) error {
	if pool == nil {
		return errors.New("migrations: nil *pgxpool.Pool")
	}
	// The *sql.DB borrows pool's connections; closing it leaves pool open.
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	return Up(ctx, db)
}

func newProvider(db *sql.DB) (*goose.Provider, error) {
	locker, err := lock.NewPostgresSessionLocker(
		lock.WithLockID(LockID),
		lock.WithLockTimeout(1, 300), // poll every second for up to five minutes
	)
	if err != nil {
		return nil, fmt.Errorf("migrations: session locker: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, FS,
		goose.WithSessionLocker(locker),
		goose.WithTableName(VersionTable),
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		return nil, fmt.Errorf("migrations: provider: %w", err)
	}
	return p, nil
}
