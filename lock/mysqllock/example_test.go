package mysqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lock/mysqllock"
	"github.com/fencekit/fencekit/migrations"
	"github.com/fencekit/fencekit/storage/mysql"
)

// The lock and the guard in one MariaDB or MySQL database, no Redis: the
// lease's fence is admitted by storage/mysql, and a holder that paused past
// its lease is refused once a newer one has written.
func ExampleNew() {
	ctx := context.Background()
	db, err := sql.Open("mysql", "root@tcp(127.0.0.1:3306)/test")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if err := migrations.UpMySQL(ctx, db); err != nil { // once per database: the guard's and the lock's tables
		log.Fatal(err)
	}
	locker, err := mysqllock.New(db)
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()
	err = locker.Do(ctx, "invoice:42", 10*time.Second, func(ctx context.Context, f fence.Fence) error {
		return mysql.InTx(ctx, db, nil, f, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `UPDATE invoices SET total = total + 5 WHERE id = 42`)
			return err
		})
	})
	if errors.Is(err, fence.ErrStale) {
		fmt.Println("a newer holder wrote first: nothing done")
		return
	}
	if err != nil {
		log.Fatal(err)
	}
}
