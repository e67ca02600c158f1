package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jmoiron/sqlx"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/migrations"
)

func TestDeposits(t *testing.T) {
	ctx := context.Background()
	db := testenv.MySQL(t)
	if err := migrations.UpMySQL(ctx, db); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO accounts VALUES (42, 0)`); err != nil {
		t.Fatal(err)
	}
	gdb, err := gorm.Open(gormmysql.New(gormmysql.Config{Conn: db}), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	dbx := sqlx.NewDb(db, "mysql")
	older := fence.Fence{Resource: "account:42", Token: 1, Holder: "old"}
	newer := fence.Fence{Resource: "account:42", Token: 2, Holder: "new"}

	if err := DepositGORM(ctx, gdb, older, 42, 10); err != nil {
		t.Fatalf("GORM deposit: %v", err)
	}
	if err := DepositSqlx(ctx, dbx, newer, 42, 5); err != nil {
		t.Fatalf("sqlx deposit: %v", err)
	}
	// The older holder is refused through either library, and writes nothing.
	if err := DepositGORM(ctx, gdb, older, 42, 100); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("stale GORM deposit = %v, want ErrStale", err)
	}
	if err := DepositSqlx(ctx, dbx, older, 42, 100); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("stale sqlx deposit = %v, want ErrStale", err)
	}
	var balance int64
	if err := db.QueryRowContext(ctx, `SELECT balance FROM accounts WHERE id = 42`).Scan(&balance); err != nil {
		t.Fatal(err)
	}
	if balance != 15 {
		t.Fatalf("balance = %d, want 15", balance)
	}
}

// TestRun runs the program against the test's MySQL or MariaDB: both
// deposits land, the stale fence is refused through GORM and sqlx, the
// balance is 15.
func TestRun(t *testing.T) {
	dsn := testenv.MySQLDSN(t)
	var stdout, stderr bytes.Buffer
	if code := run(t.Context(), []string{"-mysql", dsn}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	for _, want := range []string{"GORM: deposited 10", "sqlx: deposited 5", "refused through GORM and sqlx", "balance: 15"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, stdout.String())
		}
	}
}

// TestCommandLine: -h says in one line what the example shows and exits 0;
// an unreachable server exits 2 and says what to do.
func TestCommandLine(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run(t.Context(), []string{"-h"}, &stdout, &stderr); code != 0 {
		t.Fatalf("-h: exit %d, want 0", code)
	}
	if !strings.HasPrefix(stderr.String(), "ormguard: a fenced write through GORM and through sqlx") || !strings.Contains(stderr.String(), "-mysql") {
		t.Fatalf("-h printed:\n%s", stderr.String())
	}
	stderr.Reset()
	if code := run(t.Context(), []string{"-mysql", "root@tcp(127.0.0.1:1)/test?timeout=2s"}, &stdout, &stderr); code != 2 {
		t.Fatalf("unreachable server: exit %d, want 2 (%s)", code, stderr.String())
	}
	if !strings.Contains(stderr.String(), "pass -mysql DSN") {
		t.Fatalf("unreachable server printed:\n%s", stderr.String())
	}
}

// TestDepositGORMWithPrepareStmt: the GORM recipe works when GORM prepares
// statements (PrepareStmt, under which its transaction runs over a
// *gorm.PreparedStmtTX), and still refuses a stale fence.
func TestDepositGORMWithPrepareStmt(t *testing.T) {
	ctx := context.Background()
	db := testenv.MySQL(t)
	if err := migrations.UpMySQL(ctx, db); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO accounts VALUES (42, 0)`); err != nil {
		t.Fatal(err)
	}
	gdb, err := gorm.Open(gormmysql.New(gormmysql.Config{Conn: db}), &gorm.Config{Logger: logger.Discard, PrepareStmt: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := DepositGORM(ctx, gdb, fence.Fence{Resource: "account:42", Token: 2, Holder: "new"}, 42, 10); err != nil {
		t.Fatalf("GORM deposit with PrepareStmt: %v", err)
	}
	if err := DepositGORM(ctx, gdb, fence.Fence{Resource: "account:42", Token: 1, Holder: "old"}, 42, 100); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("stale GORM deposit with PrepareStmt = %v, want ErrStale", err)
	}
	var balance int64
	if err := db.QueryRowContext(ctx, `SELECT balance FROM accounts WHERE id = 42`).Scan(&balance); err != nil || balance != 10 {
		t.Fatalf("balance = %d (%v), want 10", balance, err)
	}
}
