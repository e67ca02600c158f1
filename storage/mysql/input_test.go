package mysql_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/storage/mysql"
)

// refusingConnector counts connection attempts and never connects: a call
// that is refused before sending anything never asks it for one.
type refusingConnector struct{ dials atomic.Int64 }

func (c *refusingConnector) Connect(context.Context) (driver.Conn, error) {
	c.dials.Add(1)
	return nil, errors.New("refusingConnector: no connection")
}

func (c *refusingConnector) Driver() driver.Driver { return nil }

// TestBadInputSendsNothing calls every entry point with input it cannot use,
// on a database that counts connection attempts: each call must return an
// error matching fence.ErrInvalid and never reach for a connection.
func TestBadInputSendsNothing(t *testing.T) {
	conn := &refusingConnector{}
	db := sql.OpenDB(conn)
	defer db.Close()
	ctx := context.Background()
	ok := fenceOf("r", 1, "h")
	noop := func(context.Context, *sql.Tx) error { return nil }
	tbl := mysql.Table{Name: "t", Key: "id"}
	var nilCtx context.Context
	calls := map[string]func() error{
		"InTx zero fence":         func() error { return mysql.InTx(ctx, db, nil, fence.Fence{}, noop) },
		"InTx empty resource":     func() error { return mysql.InTx(ctx, db, nil, fenceOf("", 1, "h"), noop) },
		"InTx empty holder":       func() error { return mysql.InTx(ctx, db, nil, fenceOf("r", 1, ""), noop) },
		"InTx token 0":            func() error { return mysql.InTx(ctx, db, nil, fenceOf("r", 0, "h"), noop) },
		"InTx negative token":     func() error { return mysql.InTx(ctx, db, nil, fenceOf("r", -1, "h"), noop) },
		"InTx long resource":      func() error { return mysql.InTx(ctx, db, nil, fenceOf(strings.Repeat("r", 1025), 1, "h"), noop) },
		"InTx long holder":        func() error { return mysql.InTx(ctx, db, nil, fenceOf("r", 1, strings.Repeat("h", 1025)), noop) },
		"InTx NUL in resource":    func() error { return mysql.InTx(ctx, db, nil, fenceOf("r\x00", 1, "h"), noop) },
		"InTx bad UTF-8":          func() error { return mysql.InTx(ctx, db, nil, fenceOf("r\xff", 1, "h"), noop) },
		"InTx nil db":             func() error { return mysql.InTx(ctx, nil, nil, ok, noop) },
		"InTx nil ctx":            func() error { return mysql.InTx(nilCtx, db, nil, ok, noop) },
		"InTx nil fn":             func() error { return mysql.InTx(ctx, db, nil, ok, nil) },
		"InTx read-only":          func() error { return mysql.InTx(ctx, db, &sql.TxOptions{ReadOnly: true}, ok, noop) },
		"Guard nil tx":            func() error { return mysql.Guard(ctx, nil, ok) },
		"Guard nil ctx":           func() error { return mysql.Guard(nilCtx, nil, ok) },
		"GuardAll nil tx":         func() error { return mysql.GuardAll(ctx, nil, ok) },
		"HighWater nil db":        func() error { _, err := mysql.HighWater(ctx, nil, "r"); return err },
		"HighWater empty":         func() error { _, err := mysql.HighWater(ctx, db, ""); return err },
		"HighWater long":          func() error { _, err := mysql.HighWater(ctx, db, strings.Repeat("r", 1025)); return err },
		"Retry nil fn":            func() error { return mysql.Retry(ctx, 0, nil) },
		"Retry negative attempts": func() error { return mysql.Retry(ctx, -1, func(context.Context) error { return nil }) },
		"Update zero fence":       func() error { return tbl.Update(ctx, db, fence.Fence{}, 1) },
		"Update nil db":           func() error { return tbl.Update(ctx, nil, ok, 1) },
		"Update no table":         func() error { return mysql.Table{Key: "id"}.Update(ctx, db, ok, 1) },
		"Update no key":           func() error { return mysql.Table{Name: "t"}.Update(ctx, db, ok, 1) },
		"Update NUL name":         func() error { return mysql.Table{Name: "t\x00", Key: "id"}.Update(ctx, db, ok, 1) },
		"Update trailing space":   func() error { return mysql.Table{Name: "t ", Key: "id"}.Update(ctx, db, ok, 1) },
		"Update long name":        func() error { return mysql.Table{Name: strings.Repeat("t", 65), Key: "id"}.Update(ctx, db, ok, 1) },
		"Update bad UTF-8 name":   func() error { return mysql.Table{Name: "t\xff", Key: "id"}.Update(ctx, db, ok, 1) },
		"Update key is token":     func() error { return mysql.Table{Name: "t", Key: "fence_token"}.Update(ctx, db, ok, 1) },
		"Update sets the token":   func() error { return tbl.Update(ctx, db, ok, 1, mysql.Set("fence_token", 9)) },
		"Update sets twice":       func() error { return tbl.Update(ctx, db, ok, 1, mysql.Set("v", 1), mysql.Set("v", 2)) },
		"Upsert long holder":      func() error { return tbl.Upsert(ctx, db, fenceOf("r", 1, strings.Repeat("h", 1025)), 1) },
		"UpdateVersion nil db": func() error {
			_, err := tbl.UpdateVersion(ctx, nil, 1, 1)
			return err
		},
		"UpdateVersion sets the version": func() error {
			_, err := tbl.UpdateVersion(ctx, db, 1, 1, mysql.Set("version", 5))
			return err
		},
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			if err := call(); !errors.Is(err, fence.ErrInvalid) {
				t.Fatalf("err = %v, want one matching fence.ErrInvalid", err)
			}
		})
	}
	if n := conn.dials.Load(); n != 0 {
		t.Fatalf("%d connection attempts: bad input must be refused before anything is sent", n)
	}
}

// TestGuardBadFenceLeavesTxAlone refuses an invalid fence on a live
// transaction without sending the guard: the transaction stays usable and
// no mark appears.
func TestGuardBadFenceLeavesTxAlone(t *testing.T) {
	ctx, db := setup(t)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	for _, f := range []fence.Fence{{}, fenceOf("", 1, "h"), fenceOf("r", 0, "h")} {
		if err := mysql.Guard(ctx, tx, f); !errors.Is(err, fence.ErrInvalid) {
			t.Fatalf("Guard(%v) = %v, want ErrInvalid", f, err)
		}
	}
	if err := mysql.GuardAll(ctx, tx, fenceOf("r", 1, "h"), fenceOf("r", 2, "h")); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("GuardAll with a resource twice = %v, want ErrInvalid", err)
	}
	if err := mysql.GuardAll(ctx, tx); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("GuardAll without fences = %v, want ErrInvalid", err)
	}
	mustExec(t, ctx, tx, `UPDATE counter SET n = 5 WHERE id = 1`)
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if got := mark(t, ctx, db, "r"); got.Token != 0 {
		t.Fatalf("mark = %v, want none", got)
	}
}
