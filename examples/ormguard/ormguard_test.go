package ormguard_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jmoiron/sqlx"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/fencekit/fencekit/examples/ormguard"
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

	if err := ormguard.DepositGORM(ctx, gdb, older, 42, 10); err != nil {
		t.Fatalf("GORM deposit: %v", err)
	}
	if err := ormguard.DepositSqlx(ctx, dbx, newer, 42, 5); err != nil {
		t.Fatalf("sqlx deposit: %v", err)
	}
	// The older holder is refused through either library, and writes nothing.
	if err := ormguard.DepositGORM(ctx, gdb, older, 42, 100); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("stale GORM deposit = %v, want ErrStale", err)
	}
	if err := ormguard.DepositSqlx(ctx, dbx, older, 42, 100); !errors.Is(err, fence.ErrStale) {
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
