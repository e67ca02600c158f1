package pgsql_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/storage/pgsql"
)

// TestOnMySQLSaysSo: every call on a MySQL or MariaDB handle fails with an
// error that names the mix-up and the package to use, with the server's
// error still wrapped, and none reports an unknown outcome: the server
// refused each statement.
func TestOnMySQLSaysSo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db := testenv.MySQL(t)
	f := fence.Fence{Resource: "wrong-db", Token: 1, Holder: "h"}
	tbl := pgsql.Table{Name: "t", Key: "id"}
	noop := func(context.Context, *sql.Tx) error { return nil }
	for name, call := range map[string]func() error{
		"InTx": func() error { return pgsql.InTx(ctx, db, nil, f, noop) },
		"Guard": func() error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			return pgsql.Guard(ctx, tx, f)
		},
		"HighWater":    func() error { _, err := pgsql.HighWater(ctx, db, "wrong-db"); return err },
		"Table.Update": func() error { return tbl.Update(ctx, db, f, 1, pgsql.Set("v", 1)) },
		"Table.Upsert": func() error { return tbl.Upsert(ctx, db, f, 1, pgsql.Set("v", 1)) },
		"Table.UpdateVersion": func() error {
			_, err := tbl.UpdateVersion(ctx, db, 1, 1, pgsql.Set("v", 1))
			return err
		},
		"Once":       func() error { _, err := pgsql.Once(ctx, db, f, "k", noop); return err },
		"LookupOnce": func() error { _, err := pgsql.LookupOnce(ctx, db, "k"); return err },
	} {
		err := call()
		if err == nil || errors.Is(err, fence.ErrOutcomeUnknown) ||
			!strings.Contains(err.Error(), "db is a MySQL or MariaDB database") || !strings.Contains(err.Error(), "use storage/mysql") ||
			!strings.Contains(err.Error(), ": Error 1") {
			t.Errorf("%s on MariaDB = %v\nwant a known outcome naming the mix-up and storage/mysql, with the server's error", name, err)
		}
	}
}
