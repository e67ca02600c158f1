package testenv

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

const mysqlHow = "start MySQL 8 or MariaDB 10.6+ on 127.0.0.1:3306 with root access without a password and a database named test, or set FENCEKIT_TEST_MYSQL to a go-sql-driver DSN (user:password@tcp(host:port)/dbname)"

var sharedMySQL struct {
	once sync.Once
	dsn  string
	err  error
}

// MySQLBaseDSN returns the DSN of the shared MySQL or MariaDB database,
// skipping (or failing) t when none answers. Most tests want [MySQLDSN]
// instead, which isolates them in a database of their own.
func MySQLBaseDSN(t testing.TB) string {
	t.Helper()
	sharedMySQL.once.Do(func() {
		sharedMySQL.dsn, sharedMySQL.err = findMySQL()
	})
	if sharedMySQL.err != nil {
		unavailable(t, "MySQL", mysqlHow, sharedMySQL.err)
	}
	return sharedMySQL.dsn
}

// MySQLConfig creates a database unique to t, drops it when t ends, and
// returns a driver configuration whose connections use it. Tests change the
// configuration (the address, to go through a [Proxy]; ClientFoundRows) and
// open it with mysql.NewConnector.
func MySQLConfig(t testing.TB) *mysql.Config {
	t.Helper()
	base := MySQLBaseDSN(t)
	cfg, err := mysql.ParseDSN(base)
	if err != nil {
		t.Fatalf("testenv: bad MySQL DSN: %v", err)
	}
	name := "fktest_" + randomID()
	admin, err := sql.Open("mysql", base)
	if err != nil {
		t.Fatalf("testenv: open MySQL: %v", err)
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The name is ours: letters, digits and an underscore, no quoting issue.
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE `"+name+"` CHARACTER SET utf8mb4"); err != nil {
		t.Fatalf("testenv: create database: %v", err)
	}
	t.Cleanup(func() {
		admin, err := sql.Open("mysql", base)
		if err != nil {
			t.Logf("testenv: drop database %s: %v", name, err)
			return
		}
		defer admin.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS `"+name+"`"); err != nil {
			t.Logf("testenv: drop database %s: %v", name, err)
		}
	})
	cfg.DBName = name
	return cfg
}

// MySQLDSN returns the DSN of a database unique to t (see [MySQLConfig]).
func MySQLDSN(t testing.TB) string {
	t.Helper()
	return MySQLConfig(t).FormatDSN()
}

// MySQL returns a *sql.DB on a database unique to t (see [MySQLConfig]); it
// is closed, and the database dropped, when t ends.
func MySQL(t testing.TB) *sql.DB {
	t.Helper()
	return OpenMySQL(t, MySQLConfig(t))
}

// OpenMySQL opens cfg and closes the *sql.DB when t ends.
func OpenMySQL(t testing.TB, cfg *mysql.Config) *sql.DB {
	t.Helper()
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatalf("testenv: MySQL connector: %v", err)
	}
	db := sql.OpenDB(conn)
	t.Cleanup(func() { _ = db.Close() }) // registered after the drop, so it runs first
	return db
}

func findMySQL() (string, error) {
	return findServer("mysql", "FENCEKIT_TEST_MYSQL", "root@tcp(127.0.0.1:3306)/test", pingMySQL)
}

func pingMySQL(dsn string) error {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return fmt.Errorf("parse %s: %w", dsn, err)
	}
	cfg.Timeout = 2 * time.Second
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return err
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return db.PingContext(ctx)
}
