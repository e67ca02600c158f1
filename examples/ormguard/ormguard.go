// Command ormguard shows how code that works through GORM or sqlx fences
// its transactions with storage/mysql's Guard on MySQL or MariaDB: take the
// *sql.Tx underneath the library's transaction and guard it first, before
// any read. It deposits through GORM and through sqlx, then shows a stale
// fence refused through either library, writing nothing.
//
// Usage:
//
//	go run ./examples/ormguard [-mysql 'root@tcp(127.0.0.1:3306)/test']
//
// It creates a database of its own for the run (so the DSN's user needs
// CREATE and DROP), applies fencekit's MySQL migrations there and drops it
// at the end. It exits with status 2 when MySQL is unreachable.
//
// docs/recipes.md quotes DepositGORM and DepositSqlx; ormguard_test.go runs
// the program against MySQL or MariaDB.
package main

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/jmoiron/sqlx"
	"gorm.io/gorm"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/storage/mysql"
)

// Account is the application's table, as GORM maps it.
type Account struct {
	ID      int64
	Balance int64
}

// DepositGORM adds amount to account id in a GORM transaction fenced by f,
// whether GORM prepares statements (PrepareStmt) or not. Call it as the
// outermost Transaction, never a nested one (a savepoint, whose rollback
// would undo the guard). A stale f returns an error matching
// fence.ErrStale, and GORM rolls back.
func DepositGORM(ctx context.Context, gdb *gorm.DB, f fence.Fence, id, amount int64) error {
	return gdb.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		pool := tx.Statement.ConnPool
		if p, ok := pool.(*gorm.PreparedStmtTX); ok { // PrepareStmt: true
			pool = p.Tx
		}
		sqlTx, ok := pool.(*sql.Tx)
		if !ok {
			return fmt.Errorf("ormguard: GORM transaction over %T, not a *sql.Tx", pool)
		}
		if err := mysql.Guard(ctx, sqlTx, f); err != nil {
			return err
		}
		var a Account
		if err := tx.First(&a, id).Error; err != nil {
			return err
		}
		return tx.Model(&a).Update("balance", a.Balance+amount).Error
	})
}

// DepositSqlx adds amount to account id in an sqlx transaction fenced by f.
// A stale f returns an error matching fence.ErrStale, and nothing is
// written.
func DepositSqlx(ctx context.Context, db *sqlx.DB, f fence.Fence, id, amount int64) error {
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() // after Commit, a no-op
	if err := mysql.Guard(ctx, tx.Tx, f); err != nil {
		return err
	}
	var balance int64
	if err := tx.GetContext(ctx, &balance, `SELECT balance FROM accounts WHERE id = ?`, id); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `UPDATE accounts SET balance = ? WHERE id = ?`, balance+amount, id); err != nil {
		return err
	}
	return tx.Commit()
}
