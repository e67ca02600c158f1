package mysql_test

import (
	"context"
	"errors"
	"testing"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/storage/mysql"
)

// TestUnconvertibleArgumentIsNotUnknown: an argument that database/sql
// cannot convert for the driver fails the call before the statement is
// sent, so the outcome is known: nothing was written. A Table call on a
// *sql.DB or a *sql.Conn must say so plainly, not that the outcome is
// unknown.
func TestUnconvertibleArgumentIsNotUnknown(t *testing.T) {
	ctx, db := setup(t)
	mustExec(t, ctx, db, `ALTER TABLE counter ADD COLUMN version BIGINT NOT NULL DEFAULT 1, ADD COLUMN fence_token BIGINT, ADD COLUMN fence_holder VARBINARY(1024)`)
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	tbl := mysql.Table{Name: "counter", Key: "id"}
	bad := struct{ X int }{1}
	for hname, q := range map[string]mysql.Querier{"*sql.DB": db, "*sql.Conn": conn} {
		for name, call := range map[string]func(ctx context.Context) error{
			"Table.Update": func(ctx context.Context) error {
				return tbl.Update(ctx, q, fenceOf("c", 1, "h"), 1, mysql.Set("n", bad))
			},
			"Table.Upsert": func(ctx context.Context) error {
				return tbl.Upsert(ctx, q, fenceOf("c", 1, "h"), 1, mysql.Set("n", bad))
			},
			"Table.UpdateVersion": func(ctx context.Context) error {
				_, err := tbl.UpdateVersion(ctx, q, 1, 1, mysql.Set("n", bad))
				return err
			},
		} {
			err := call(ctx)
			if err == nil || errors.Is(err, fence.ErrOutcomeUnknown) {
				t.Errorf("%s on a %s with an argument database/sql cannot convert = %v, want a known outcome", name, hname, err)
			}
		}
	}
	if n, _ := counter(t, ctx, db); n != 0 {
		t.Fatalf("counter = %d, want 0: nothing may be written", n)
	}
}
