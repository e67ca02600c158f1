package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"time"

	"github.com/pressly/goose/v3"
)

//go:embed mysql/*.sql
var embeddedMySQL embed.FS

// MySQLFS holds the goose SQL migrations of storage/mysql, for MySQL 8 and
// MariaDB 10.6 and later, at its root (00001_*.sql, ...). It is read-only
// and safe for concurrent use.
var MySQLFS fs.FS = mustSub(embeddedMySQL, "mysql")

// MySQLLockName is the named lock (GET_LOCK) that [UpMySQL] holds while it
// migrates. Named locks are server-wide, so the name is one no application
// would choose by chance; it is the same for every database on a server,
// which only makes migrations of two databases wait for each other.
const MySQLLockName = "fencekit.migrations"

// UpMySQL applies every migration in [MySQLFS] that db has not applied yet,
// in order, recording them in the goose version table [VersionTable] of
// db's current database. Concurrent calls, from this process or others,
// serialise on the named lock [MySQLLockName]: each migration is applied
// once and every caller returns nil once the schema is current. When nothing
// is pending, UpMySQL changes nothing.
//
// MySQL commits DDL statements implicitly, so a migration cannot be rolled
// back with its transaction: each one is written to be safe to run again
// (CREATE TABLE IF NOT EXISTS) should a process die between a migration and
// its version record.
//
// ctx bounds the whole run, including waiting for the lock (which otherwise
// gives up after five minutes). db must be a MySQL or MariaDB database opened
// with github.com/go-sql-driver/mysql, with a current database (the DSN's
// /dbname), that may open at least two connections; on a PostgreSQL
// database UpMySQL changes nothing and returns an error that says to call
// [Up].
func UpMySQL(ctx context.Context, db *sql.DB) error {
	if ctx == nil {
		return errors.New("migrations: nil context")
	}
	if db == nil {
		return errors.New("migrations: nil *sql.DB")
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	if isPostgresDriver(db) {
		return errPostgres("")
	}
	if err := upMySQL(ctx, db); err != nil {
		if v, ok := postgresVersion(ctx, db); ok {
			return fmt.Errorf("%w: %w", errPostgres(v), err)
		}
		return err
	}
	return nil
}

func upMySQL(ctx context.Context, db *sql.DB) error {
	if db.Stats().MaxOpenConnections == 1 {
		return errors.New("migrations: UpMySQL needs a *sql.DB that may open two connections: one holds the named lock while goose migrates on another")
	}
	// The lock is taken here rather than through goose's session locker:
	// goose creates its version table before it locks, and MySQL commits
	// that CREATE TABLE at once, before the version-0 row goes in, so a
	// concurrent process could find the table without it. Holding the lock
	// around all of goose's work serialises that too.
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	defer conn.Close()
	lock := namedLock{name: MySQLLockName, wait: 5 * time.Minute}
	if err := lock.SessionLock(ctx, conn); err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	// The lock goes with the connection, which Close returns to the pool:
	// release it first, even when ctx has ended.
	defer func() { _ = lock.SessionUnlock(context.WithoutCancel(ctx), conn) }()
	p, err := goose.NewProvider(goose.DialectMySQL, db, MySQLFS,
		goose.WithTableName(VersionTable),
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		return fmt.Errorf("migrations: provider: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("migrations: up: %w", err)
	}
	return nil
}

// errPostgres is UpMySQL's refusal of a PostgreSQL database (version, when
// known, is the server's).
func errPostgres(version string) error {
	if version != "" {
		version = " (" + version + ")"
	}
	return fmt.Errorf("migrations: UpMySQL applies fencekit's MySQL migrations, but db is a PostgreSQL database%s: call migrations.Up(ctx, db) instead", version)
}

// postgresDriverPkgs are the packages of the PostgreSQL drivers' types,
// named rather than imported.
var postgresDriverPkgs = [...]string{"github.com/jackc/pgx/v5/stdlib", "github.com/lib/pq"}

// isPostgresDriver reports whether db was opened with pgx's stdlib or
// lib/pq.
func isPostgresDriver(db *sql.DB) bool {
	pkg := driverPkg(db)
	for _, p := range postgresDriverPkgs {
		if pkg == p {
			return true
		}
	}
	return false
}

// postgresVersion asks a database on which the MySQL migrations failed for
// its version, and reports it when the server is PostgreSQL (behind a
// driver wrapper that isPostgresDriver cannot see through), whose
// version() starts with "PostgreSQL".
func postgresVersion(ctx context.Context, db *sql.DB) (string, bool) {
	var v string
	if err := db.QueryRowContext(ctx, "SELECT version()").Scan(&v); err != nil {
		return "", false
	}
	return v, strings.HasPrefix(v, "PostgreSQL")
}

// SQL of the named lock. GET_LOCK returns 1 when it took the lock, 0 when its
// timeout (in seconds) passed first, and NULL on an error.
const (
	getLockSQL     = `SELECT GET_LOCK(?, ?)`
	releaseLockSQL = `SELECT RELEASE_LOCK(?)`
)

// namedLock is a MySQL named lock held by one connection. It goes with
// the connection if the process dies.
type namedLock struct {
	name string
	wait time.Duration
}

// SessionLock takes the lock, asking the server for one second at a time so
// that ctx is honoured between tries.
func (l namedLock) SessionLock(ctx context.Context, conn *sql.Conn) error {
	deadline := time.Now().Add(l.wait)
	for {
		var got sql.NullInt64
		if err := conn.QueryRowContext(ctx, getLockSQL, l.name, 1).Scan(&got); err != nil {
			return fmt.Errorf("GET_LOCK(%q): %w", l.name, err)
		}
		switch {
		case got.Valid && got.Int64 == 1:
			return nil
		case !got.Valid:
			return fmt.Errorf("GET_LOCK(%q) failed", l.name)
		case time.Now().After(deadline):
			return fmt.Errorf("GET_LOCK(%q): still held by another session after %v", l.name, l.wait)
		}
	}
}

// SessionUnlock releases the lock.
func (l namedLock) SessionUnlock(ctx context.Context, conn *sql.Conn) error {
	var released sql.NullInt64
	if err := conn.QueryRowContext(ctx, releaseLockSQL, l.name).Scan(&released); err != nil {
		return fmt.Errorf("RELEASE_LOCK(%q): %w", l.name, err)
	}
	if !released.Valid || released.Int64 != 1 {
		return fmt.Errorf("RELEASE_LOCK(%q): the lock was not held by this session", l.name)
	}
	return nil
}

func mustSub(fsys fs.FS, dir string) fs.FS {
	sub, err := fs.Sub(fsys, dir)
	if err != nil {
		panic(err) // dir is a constant that go:embed has checked
	}
	return sub
}
