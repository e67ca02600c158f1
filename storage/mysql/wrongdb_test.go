package mysql_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/storage/mysql"
)

// TestOnPostgresSaysSo: every call on a PostgreSQL handle fails with an
// error that names the mix-up and the packages to use, with the server's
// error still wrapped, and none reports an unknown outcome: the server
// refused each statement.
func TestOnPostgresSaysSo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := sql.Open("pgx", testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	f := fence.Fence{Resource: "wrong-db", Token: 1, Holder: "h"}
	tbl := mysql.Table{Name: "t", Key: "id"}
	noop := func(context.Context, *sql.Tx) error { return nil }
	for name, call := range map[string]func() error{
		"InTx": func() error { return mysql.InTx(ctx, db, nil, f, noop) },
		"Guard": func() error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			return mysql.Guard(ctx, tx, f)
		},
		"HighWater":    func() error { _, err := mysql.HighWater(ctx, db, "wrong-db"); return err },
		"Table.Update": func() error { return tbl.Update(ctx, db, f, 1, mysql.Set("v", 1)) },
		"Table.Upsert": func() error { return tbl.Upsert(ctx, db, f, 1, mysql.Set("v", 1)) },
		"Table.UpdateVersion": func() error {
			_, err := tbl.UpdateVersion(ctx, db, 1, 1, mysql.Set("v", 1))
			return err
		},
		"Once":       func() error { _, err := mysql.Once(ctx, db, f, "k", noop); return err },
		"LookupOnce": func() error { _, err := mysql.LookupOnce(ctx, db, "k"); return err },
	} {
		err := call()
		if err == nil || errors.Is(err, fence.ErrOutcomeUnknown) ||
			!strings.Contains(err.Error(), "db is a PostgreSQL database") || !strings.Contains(err.Error(), "use storage/pgsql") ||
			!strings.Contains(err.Error(), "SQLSTATE") {
			t.Errorf("%s on PostgreSQL = %v\nwant a known outcome naming the mix-up and storage/pgsql, with the server's error", name, err)
		}
	}
}
