package observe_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/migrations"
	"github.com/fencekit/fencekit/storage/mysql"
)

func TestMySQLCountsRejections(t *testing.T) {
	ctx := context.Background()
	db := testenv.MySQL(t)
	if err := migrations.UpMySQL(ctx, db); err != nil {
		t.Fatal(err)
	}
	stale := []attribute.KeyValue{attribute.String("storage", "mysql"), attribute.String("reason", "stale")}
	conflict := []attribute.KeyValue{attribute.String("storage", "mysql"), attribute.String("reason", "conflict")}
	beforeStale, beforeConflict := count(t, "fencekit.fence.rejections", stale...), count(t, "fencekit.fence.rejections", conflict...)
	older, newer := staleFences("acct-" + testenv.Prefix(t))
	noop := func(context.Context, *sql.Tx) error { return nil }
	if err := mysql.InTx(ctx, db, nil, newer, noop); err != nil {
		t.Fatal(err)
	}
	if err := mysql.InTx(ctx, db, nil, older, noop); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("stale InTx = %v", err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := mysql.Guard(ctx, tx, older); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("stale Guard = %v", err)
	}
	_ = tx.Rollback()
	if _, err := db.ExecContext(ctx, "CREATE TABLE accts (id INT PRIMARY KEY, version BIGINT NOT NULL DEFAULT 1)"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "INSERT INTO accts (id) VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	tbl := mysql.Table{Name: "accts", Key: "id"}
	if _, err := tbl.UpdateVersion(ctx, db, 1, 7); !errors.Is(err, fence.ErrConflict) {
		t.Fatalf("stale UpdateVersion = %v", err)
	}
	if got := count(t, "fencekit.fence.rejections", stale...) - beforeStale; got != 2 {
		t.Fatalf("mysql stale rejections: %d more, want 2", got)
	}
	if got := count(t, "fencekit.fence.rejections", conflict...) - beforeConflict; got != 1 {
		t.Fatalf("mysql conflicts: %d more, want 1", got)
	}
	s := findSpan(t, "fencekit.mysql.in_tx", attribute.String("fencekit.resource", older.Resource), outcome("stale"))
	if s.Status().Code != codes.Error || len(s.Events()) == 0 {
		t.Fatalf("refused InTx's span: status %v, events %v", s.Status(), s.Events())
	}
	findSpan(t, "fencekit.mysql.guard", attribute.String("fencekit.resource", older.Resource), outcome("stale"))
	findSpan(t, "fencekit.mysql.in_tx", attribute.String("fencekit.resource", newer.Resource), outcome("ok"))
	findSpan(t, "fencekit.mysql.table_update_version", outcome("conflict"))

	// GuardAll's span names its resources and tokens, in locking order.
	tx, err = db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	a, b := fence.Fence{Resource: "b-" + newer.Resource, Token: 3, Holder: "h"}, fence.Fence{Resource: "a-" + newer.Resource, Token: 4, Holder: "h"}
	if err := mysql.GuardAll(ctx, tx, a, b); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback()
	findSpan(t, "fencekit.mysql.guard_all", attribute.StringSlice("fencekit.resource", []string{b.Resource, a.Resource}),
		attribute.Int64Slice("fencekit.token", []int64{4, 3}), outcome("ok"))

	// Once's span names whether it ran the work.
	for _, want := range []bool{true, false} {
		ran, err := mysql.Once(ctx, db, newer, "job-"+older.Resource, noop)
		if err != nil || ran != want {
			t.Fatalf("Once = %v, %v; want ran=%v", ran, err, want)
		}
		findSpan(t, "fencekit.mysql.once", attribute.String("fencekit.resource", newer.Resource),
			attribute.Bool("fencekit.once.ran", want), outcome("ok"))
	}
}
