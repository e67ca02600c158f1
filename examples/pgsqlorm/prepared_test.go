package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	gormpg "gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/migrations"
	"github.com/fencekit/fencekit/storage/pgsql"
)

// TestGORMRecipesWithAndWithoutPrepareStmt: the GORM recipes (pgsql.InTx
// with a GORM session on its transaction, as DepositGORM and the README
// print it, and GORM's own Transaction with pgsql.Guard first) deposit with PrepareStmt off and on (a common
// production setting, under which GORM's transaction runs over a
// *gorm.PreparedStmtTX), and refuse a stale fence writing nothing.
func TestGORMRecipesWithAndWithoutPrepareStmt(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	db, err := sql.Open("pgx", testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := migrations.Up(ctx, db); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE accounts (id bigint PRIMARY KEY, balance bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	recipes := map[string]func(ctx context.Context, gdb *gorm.DB, f fence.Fence, id, amount int64) error{
		"InTx": func(ctx context.Context, gdb *gorm.DB, f fence.Fence, id, amount int64) error {
			return DepositGORM(ctx, db, gdb, f, id, amount)
		},
		"Transaction": DepositGORMTransaction,
		"README": func(ctx context.Context, gdb *gorm.DB, f fence.Fence, id, amount int64) error {
			return depositREADME(ctx, db, gdb, f, id, amount)
		},
	}
	id := int64(0)
	for _, prepare := range []bool{false, true} {
		gdb, err := gorm.Open(gormpg.New(gormpg.Config{Conn: db}), &gorm.Config{Logger: logger.Discard, PrepareStmt: prepare})
		if err != nil {
			t.Fatal(err)
		}
		for name, deposit := range recipes {
			id++
			t.Run(fmt.Sprintf("%s/PrepareStmt=%v", name, prepare), func(t *testing.T) {
				if _, err := db.ExecContext(ctx, `INSERT INTO accounts VALUES ($1, 0)`, id); err != nil {
					t.Fatal(err)
				}
				resource := fmt.Sprintf("account:%d", id)
				if err := deposit(ctx, gdb, fence.Fence{Resource: resource, Token: 2, Holder: "new"}, id, 10); err != nil {
					t.Fatalf("deposit under token 2: %v", err)
				}
				if err := deposit(ctx, gdb, fence.Fence{Resource: resource, Token: 1, Holder: "old"}, id, 100); !errors.Is(err, fence.ErrStale) {
					t.Fatalf("deposit under token 1 after token 2 = %v, want fence.ErrStale", err)
				}
				var balance int64
				if err := db.QueryRowContext(ctx, `SELECT balance FROM accounts WHERE id = $1`, id).Scan(&balance); err != nil || balance != 10 {
					t.Fatalf("balance = %d (%v), want 10", balance, err)
				}
				if p, ok := gdb.Statement.ConnPool.(*gorm.PreparedStmtDB); ok && name != "README" && len(p.Stmts.Keys()) == 0 {
					t.Fatalf("PrepareStmt: GORM prepared no statement")
				}
			})
		}
	}
}

// TestGORMNestedTransactionGuardRefused: a guard inside a nested GORM
// Transaction stands in a savepoint, which GORM rolls back when the nested
// function returns an error; the outer transaction would then go on
// unfenced. pgsql.Guard refuses to run there, with PrepareStmt off and on,
// so the outer transaction, which returns the refusal, writes nothing.
func TestGORMNestedTransactionGuardRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	db, err := sql.Open("pgx", testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := migrations.Up(ctx, db); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE accounts (id bigint PRIMARY KEY, balance bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	for i, prepare := range []bool{false, true} {
		gdb, err := gorm.Open(gormpg.New(gormpg.Config{Conn: db}), &gorm.Config{Logger: logger.Discard, PrepareStmt: prepare})
		if err != nil {
			t.Fatal(err)
		}
		id := int64(i + 1)
		if _, err := db.ExecContext(ctx, `INSERT INTO accounts VALUES ($1, 0)`, id); err != nil {
			t.Fatal(err)
		}
		f := fence.Fence{Resource: fmt.Sprintf("nested:%d", id), Token: 1, Holder: "h"}
		err = gdb.WithContext(ctx).Transaction(func(outer *gorm.DB) error {
			if err := outer.Transaction(func(inner *gorm.DB) error {
				sqlTx, err := SQLTx(inner)
				if err != nil {
					return err
				}
				return pgsql.Guard(ctx, sqlTx, f)
			}); err != nil {
				return err
			}
			return outer.Model(&Account{ID: id}).Update("balance", 7).Error
		})
		if !errors.Is(err, fence.ErrInvalid) || !strings.Contains(err.Error(), "savepoint") {
			t.Fatalf("PrepareStmt=%v: guard in a nested Transaction = %v, want fence.ErrInvalid naming the savepoint", prepare, err)
		}
		var balance int64
		if err := db.QueryRowContext(ctx, `SELECT balance FROM accounts WHERE id = $1`, id).Scan(&balance); err != nil || balance != 0 {
			t.Fatalf("PrepareStmt=%v: balance = %d (%v), want 0", prepare, balance, err)
		}
	}
}

// depositREADME is the README's GORM recipe, as printed there.
func depositREADME(ctx context.Context, db *sql.DB, gdb *gorm.DB, f fence.Fence, id, amount int64) error {
	return pgsql.InTx(ctx, db, nil, f, func(ctx context.Context, tx *sql.Tx) error { // db is gdb's *sql.DB
		g := gdb.Session(&gorm.Session{Context: ctx, NewDB: true})
		g.Statement.ConnPool = tx // as GORM's own Begin does
		var a Account
		if err := g.First(&a, id).Error; err != nil {
			return err
		}
		return g.Model(&a).Update("balance", a.Balance+amount).Error
	})
}
