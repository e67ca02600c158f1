package mysql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"

	_ "github.com/go-sql-driver/mysql" // registers the "mysql" driver

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/migrations"
	"github.com/fencekit/fencekit/storage/mysql"
)

// A fenced read-modify-write with database/sql: the guard admits the fence
// first, so the read and the write inside the transaction cannot be
// overtaken by an older holder.
func ExampleInTx() {
	ctx := context.Background()
	db, err := sql.Open("mysql", "root@tcp(127.0.0.1:3306)/test")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if err := migrations.UpMySQL(ctx, db); err != nil { // once per database
		log.Fatal(err)
	}

	// f comes from the lock, e.g. lease.Fence().
	f := fence.Fence{Resource: "account:42", Token: 7, Holder: fence.NewHolder()}
	err = mysql.InTx(ctx, db, nil, f, func(ctx context.Context, tx *sql.Tx) error {
		var balance int64
		if err := tx.QueryRowContext(ctx, `SELECT balance FROM accounts WHERE id = ?`, 42).Scan(&balance); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `UPDATE accounts SET balance = ? WHERE id = ?`, balance+100, 42)
		return err
	})
	switch {
	case errors.Is(err, fence.ErrStale):
		hw, _ := fence.LostTo(err)
		fmt.Println("a newer holder was admitted:", hw.Token)
	case errors.Is(err, fence.ErrOutcomeUnknown):
		fmt.Println("the COMMIT's answer was lost: read before deciding, or use Once")
	case err != nil:
		log.Fatal(err)
	}
}

// Fencing a transaction that something else began: an ORM, a query builder,
// or your own code. Guard must be the transaction's first statement. With
// sqlx, pass the *sql.Tx inside a *sqlx.Tx (tx.Tx); with GORM, the *sql.Tx
// that db.Transaction's callback gets as tx.Statement.ConnPool.
func ExampleGuard() {
	ctx := context.Background()
	db, err := sql.Open("mysql", "root@tcp(127.0.0.1:3306)/test")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	f := fence.Fence{Resource: "account:42", Token: 7, Holder: fence.NewHolder()}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback() // after Commit, a no-op
	if err := mysql.Guard(ctx, tx, f); err != nil {
		log.Fatal(err) // stale: roll back (deferred) and drop the work
	}
	if _, err := tx.ExecContext(ctx, `UPDATE accounts SET balance = balance + ? WHERE id = ?`, 100, 42); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
}

// Row-level fencing: the account row carries its own mark in fence_token
// and fence_holder columns, so no guard row is needed per account.
func ExampleTable_Update() {
	ctx := context.Background()
	db, err := sql.Open("mysql", "root@tcp(127.0.0.1:3306)/test")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	accounts := mysql.Table{Name: "accounts", Key: "id"}
	f := fence.Fence{Resource: "account:42", Token: 7, Holder: fence.NewHolder()}
	err = accounts.Update(ctx, db, f, 42, mysql.Set("status", "closed"))
	switch {
	case errors.Is(err, fence.ErrStale):
		fmt.Println("a newer holder wrote the row")
	case errors.Is(err, fence.ErrNotFound):
		fmt.Println("no account 42")
	case err != nil:
		log.Fatal(err)
	}
}
