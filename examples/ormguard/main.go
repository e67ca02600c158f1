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

	drv "github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/fencekit/fencekit/examples/internal/cli"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/migrations"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// run is the program; it returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("ormguard", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dsn := fs.String("mysql", "root@tcp(127.0.0.1:3306)/test", "MySQL or MariaDB DSN, user:password@tcp(host:port)/dbname; the run uses a database of its own beside dbname")
	if done, code := cli.Parse(fs, "ormguard", "a fenced write through GORM and through sqlx on MySQL or MariaDB (storage/mysql's Guard), and a stale fence refused", args); done {
		return code
	}
	cfg, err := drv.ParseDSN(*dsn)
	if err != nil {
		fmt.Fprintf(stderr, "ormguard: -mysql %q: %v\n", *dsn, err)
		return 2
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	admin, err := open(ctx, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "ormguard: cannot reach MySQL at %s: %v\nstart MySQL or MariaDB there or pass -mysql DSN\n", cfg.Addr, err)
		return 2
	}
	defer admin.Close()
	if err := demo(ctx, admin, cfg, stdout); err != nil {
		fmt.Fprintf(stderr, "ormguard: %v\n", err)
		return 1
	}
	return 0
}

// open opens cfg and checks that the server answers.
func open(ctx context.Context, cfg *drv.Config) (*sql.DB, error) {
	conn, err := drv.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(conn)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}

// demo runs the example in a database of its own, created through admin
// and dropped at the end.
func demo(ctx context.Context, admin *sql.DB, cfg *drv.Config, out io.Writer) (err error) {
	name := "ormguard_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE `"+name+"`"); err != nil {
		return fmt.Errorf("create the run's database: %w", err)
	}
	defer func() {
		if _, derr := admin.ExecContext(context.WithoutCancel(ctx), "DROP DATABASE `"+name+"`"); err == nil {
			err = derr
		}
	}()
	own := cfg.Clone()
	own.DBName = name
	db, err := open(ctx, own)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := migrations.UpMySQL(ctx, db); err != nil {
		return err
	}
	for _, q := range []string{
		`CREATE TABLE accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL)`,
		`INSERT INTO accounts VALUES (42, 0)`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return err
		}
	}
	gdb, err := gorm.Open(gormmysql.New(gormmysql.Config{Conn: db}), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return err
	}
	dbx := sqlx.NewDb(db, "mysql")

	// A lock hands these out (lock.Lease.Fence); the newer one is a later
	// grant of the same resource.
	older := fence.Fence{Resource: "account:42", Token: 1, Holder: "old"}
	newer := fence.Fence{Resource: "account:42", Token: 2, Holder: "new"}

	if err := DepositGORM(ctx, gdb, older, 42, 10); err != nil {
		return fmt.Errorf("GORM deposit: %w", err)
	}
	fmt.Fprintln(out, "GORM: deposited 10 under token 1")
	if err := DepositSqlx(ctx, dbx, newer, 42, 5); err != nil {
		return fmt.Errorf("sqlx deposit: %w", err)
	}
	fmt.Fprintln(out, "sqlx: deposited 5 under token 2")
	// The older holder wakes up: refused through either library.
	if err := DepositGORM(ctx, gdb, older, 42, 100); !errors.Is(err, fence.ErrStale) {
		return fmt.Errorf("stale GORM deposit = %v, want fence.ErrStale", err)
	}
	if err := DepositSqlx(ctx, dbx, older, 42, 100); !errors.Is(err, fence.ErrStale) {
		return fmt.Errorf("stale sqlx deposit = %v, want fence.ErrStale", err)
	}
	fmt.Fprintln(out, "token 1 again: refused through GORM and sqlx (fence.ErrStale)")
	var balance int64
	if err := db.QueryRowContext(ctx, `SELECT balance FROM accounts WHERE id = 42`).Scan(&balance); err != nil {
		return err
	}
	fmt.Fprintf(out, "balance: %d\n", balance)
	if balance != 15 {
		return fmt.Errorf("balance = %d, want 15", balance)
	}
	return nil
}
