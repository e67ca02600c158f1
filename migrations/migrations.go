package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"

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
// database/sql driver such as github.com/jackc/pgx/v5/stdlib.
func Up(ctx context.Context, db *sql.DB) error {
	if db == nil {
		return errors.New("migrations: nil *sql.DB")
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	p, err := newProvider(db)
	if err != nil {
		return err
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("migrations: up: %w", err)
	}
	return nil
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
