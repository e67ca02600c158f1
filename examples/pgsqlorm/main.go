// Command pgsqlorm shows a fenced write through GORM, sqlx and bun on
// PostgreSQL, with storage/pgsql. With GORM and sqlx, pgsql.InTx begins the
// transaction and guards the fence as its first statement, and the library
// works on the same *sql.Tx (GORM with PrepareStmt too; DepositGORMTransaction
// shows GORM's own Transaction instead). With bun, the library begins the transaction
// (RunInTx) and pgsql.Guard runs first in it, on the *sql.Tx that a bun.Tx
// holds. A stale fence is refused before the library reads anything,
// through each of them, and writes nothing.
//
// Usage:
//
//	go run ./examples/pgsqlorm [-postgres postgres://postgres@127.0.0.1:5432/test?sslmode=disable]
//
// It applies fencekit's migrations, creates a table of its own for the run
// and drops it at the end. It exits with status 2 when PostgreSQL is
// unreachable.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	"github.com/jmoiron/sqlx"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/pgdialect"
	gormpg "gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/fencekit/fencekit/examples/internal/cli"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/migrations"
	"github.com/fencekit/fencekit/storage/pgsql"
)

// Account is the application's table, as GORM maps it.
type Account struct {
	ID      int64
	Balance int64
}

// DepositGORM adds amount to account id in a transaction fenced by f, doing
// its work through GORM: a GORM session runs on InTx's *sql.Tx, so every
// statement GORM sends comes after the guard. It works whether gdb prepares
// statements (PrepareStmt) or not. A stale f returns an error matching
// fence.ErrStale, and nothing is written.
func DepositGORM(ctx context.Context, db *sql.DB, gdb *gorm.DB, f fence.Fence, id, amount int64) error {
	return pgsql.InTx(ctx, db, nil, f, func(ctx context.Context, tx *sql.Tx) error {
		g := GORMOn(ctx, gdb, tx)
		var a Account
		if err := g.First(&a, id).Error; err != nil {
			return err
		}
		return g.Model(&a).Update("balance", a.Balance+amount).Error
	})
}

// GORMOn returns a GORM session of gdb whose statements run on tx, as
// GORM's own Begin would set it up: with PrepareStmt, statements are
// prepared on tx through gdb's statement cache; without, sent as they are.
func GORMOn(ctx context.Context, gdb *gorm.DB, tx *sql.Tx) *gorm.DB {
	g := gdb.Session(&gorm.Session{Context: ctx, NewDB: true})
	if p, ok := gdb.Statement.ConnPool.(*gorm.PreparedStmtDB); ok {
		g.Statement.ConnPool = &gorm.PreparedStmtTX{Tx: tx, PreparedStmtDB: p}
	} else {
		g.Statement.ConnPool = tx
	}
	return g
}

// DepositGORMTransaction adds amount to account id in a GORM transaction
// fenced by f: GORM begins the transaction, and pgsql.Guard is its first
// statement. Call it as the outermost Transaction: inside a nested one (a
// savepoint) pgsql.Guard refuses to run. A stale f returns an error
// matching fence.ErrStale, and GORM rolls back.
func DepositGORMTransaction(ctx context.Context, gdb *gorm.DB, f fence.Fence, id, amount int64) error {
	return gdb.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		sqlTx, err := SQLTx(tx)
		if err != nil {
			return err
		}
		if err := pgsql.Guard(ctx, sqlTx, f); err != nil {
			return err // GORM rolls back
		}
		var a Account
		if err := tx.First(&a, id).Error; err != nil {
			return err
		}
		return tx.Model(&a).Update("balance", a.Balance+amount).Error
	})
}

// SQLTx returns the *sql.Tx under a GORM transaction, whether gdb prepares
// statements (PrepareStmt: the transaction's pool is then a
// *gorm.PreparedStmtTX holding the *sql.Tx) or not.
func SQLTx(tx *gorm.DB) (*sql.Tx, error) {
	pool := tx.Statement.ConnPool
	if p, ok := pool.(*gorm.PreparedStmtTX); ok {
		pool = p.Tx
	}
	if t, ok := pool.(*sql.Tx); ok {
		return t, nil
	}
	return nil, fmt.Errorf("GORM transaction over %T, not a *sql.Tx: call this inside Transaction, on a *gorm.DB opened on a *sql.DB", pool)
}

// DepositSqlx adds amount to account id in a transaction fenced by f, doing
// its work through sqlx on InTx's *sql.Tx. A stale f returns an error
// matching fence.ErrStale, and nothing is written.
func DepositSqlx(ctx context.Context, db *sqlx.DB, f fence.Fence, id, amount int64) error {
	return pgsql.InTx(ctx, db.DB, nil, f, func(ctx context.Context, sqlTx *sql.Tx) error {
		tx := &sqlx.Tx{Tx: sqlTx, Mapper: db.Mapper}
		var balance int64
		if err := tx.GetContext(ctx, &balance, db.Rebind(`SELECT balance FROM accounts WHERE id = ?`), id); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, db.Rebind(`UPDATE accounts SET balance = ? WHERE id = ?`), balance+amount, id)
		return err
	})
}

// DepositBun adds amount to account id in a transaction fenced by f, doing
// its work through bun: bun begins the transaction, and pgsql.Guard is its
// first statement, so that a stale f is refused before bun reads anything.
// A stale f returns an error matching fence.ErrStale, and bun rolls back.
func DepositBun(ctx context.Context, db *bun.DB, f fence.Fence, id, amount int64) error {
	return db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		if err := pgsql.Guard(ctx, tx.Tx, f); err != nil {
			return err
		}
		var balance int64
		if err := tx.NewSelect().Table("accounts").Column("balance").Where("id = ?", id).Scan(ctx, &balance); err != nil {
			return err
		}
		_, err := tx.NewUpdate().Table("accounts").Set("balance = ?", balance+amount).Where("id = ?", id).Exec(ctx)
		return err
	})
}

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// run is the program; it returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("pgsqlorm", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("postgres", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL URL")
	if done, code := cli.Parse(fs, "pgsqlorm", "a fenced write through GORM, sqlx and bun on PostgreSQL (storage/pgsql), and a stale fence refused", args); done {
		return code
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	db, err := sql.Open("pgx", *url)
	if err == nil {
		err = db.PingContext(ctx)
	}
	if err != nil {
		fmt.Fprintf(stderr, "pgsqlorm: cannot reach PostgreSQL at %s: %v\nstart PostgreSQL there or pass -postgres URL\n", *url, err)
		return 2
	}
	defer db.Close()
	if err := demo(ctx, db, stdout); err != nil {
		fmt.Fprintf(stderr, "pgsqlorm: %v\n", err)
		return 1
	}
	return 0
}

// demo runs the example on db in a schema of its own, dropped at the end.
func demo(ctx context.Context, db *sql.DB, out io.Writer) (err error) {
	if err := migrations.Up(ctx, db); err != nil {
		return err
	}
	// One connection, so that the run's search_path holds for every
	// statement: the table is the run's own, fencekit's objects where the
	// migrations put them.
	db.SetMaxOpenConns(1)
	schema := "pgsqlorm_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	for _, q := range []string{
		`CREATE SCHEMA ` + schema,
		`SELECT set_config('search_path', '` + schema + `, ' || current_setting('search_path'), false)`,
		`CREATE TABLE accounts (id bigint PRIMARY KEY, balance bigint NOT NULL)`,
		`INSERT INTO accounts VALUES (42, 0)`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return err
		}
	}
	defer func() {
		if _, derr := db.ExecContext(context.WithoutCancel(ctx), `DROP SCHEMA `+schema+` CASCADE`); err == nil {
			err = derr
		}
	}()
	gdb, err := gorm.Open(gormpg.New(gormpg.Config{Conn: db}), &gorm.Config{Logger: logger.Discard, SkipDefaultTransaction: true})
	if err != nil {
		return err
	}
	dbx := sqlx.NewDb(db, "pgx")
	bdb := bun.NewDB(db, pgdialect.New())

	// A lock hands these out (lock.Lease.Fence); the newer one is a later
	// grant of the same resource.
	resource := "account:42:" + schema
	older := fence.Fence{Resource: resource, Token: 1, Holder: "old"}
	newer := fence.Fence{Resource: resource, Token: 2, Holder: "new"}
	newest := fence.Fence{Resource: resource, Token: 3, Holder: "newest"}

	if err := DepositGORM(ctx, db, gdb, older, 42, 10); err != nil {
		return fmt.Errorf("GORM deposit: %w", err)
	}
	fmt.Fprintln(out, "GORM: deposited 10 under token 1")
	if err := DepositSqlx(ctx, dbx, newer, 42, 5); err != nil {
		return fmt.Errorf("sqlx deposit: %w", err)
	}
	fmt.Fprintln(out, "sqlx: deposited 5 under token 2")
	if err := DepositBun(ctx, bdb, newest, 42, 20); err != nil {
		return fmt.Errorf("bun deposit: %w", err)
	}
	fmt.Fprintln(out, "bun: deposited 20 under token 3")
	// The older holder wakes up: refused through each library.
	if err := DepositGORM(ctx, db, gdb, older, 42, 100); !errors.Is(err, fence.ErrStale) {
		return fmt.Errorf("stale GORM deposit = %v, want fence.ErrStale", err)
	}
	if err := DepositSqlx(ctx, dbx, older, 42, 100); !errors.Is(err, fence.ErrStale) {
		return fmt.Errorf("stale sqlx deposit = %v, want fence.ErrStale", err)
	}
	if err := DepositBun(ctx, bdb, older, 42, 100); !errors.Is(err, fence.ErrStale) {
		return fmt.Errorf("stale bun deposit = %v, want fence.ErrStale", err)
	}
	fmt.Fprintln(out, "token 1 again: refused through GORM, sqlx and bun (fence.ErrStale)")
	var balance int64
	if err := db.QueryRowContext(ctx, `SELECT balance FROM accounts WHERE id = 42`).Scan(&balance); err != nil {
		return err
	}
	fmt.Fprintf(out, "balance: %d\n", balance)
	if balance != 35 {
		return fmt.Errorf("balance = %d, want 35", balance)
	}
	return nil
}
