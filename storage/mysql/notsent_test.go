package mysql_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/storage/mysql"
)

// TestNeverSentIsNotUnknown: a Table call on a *sql.DB whose pool has no
// connection, while the network carries nothing, or while every new
// connection is reset, fails without sending its statement: the error must
// say so plainly, not that the outcome is unknown. The counter row is left
// as it was.
func TestNeverSentIsNotUnknown(t *testing.T) {
	tbl := mysql.Table{Name: "counter", Key: "id"}
	calls := map[string]func(ctx context.Context, db *sql.DB) error{
		"Table.Update": func(ctx context.Context, db *sql.DB) error {
			return tbl.Update(ctx, db, fenceOf("c", 1, "h"), 1, mysql.Set("n", 7))
		},
		"Table.Upsert": func(ctx context.Context, db *sql.DB) error {
			return tbl.Upsert(ctx, db, fenceOf("c", 1, "h"), 1, mysql.Set("n", 7))
		},
		"Table.UpdateVersion": func(ctx context.Context, db *sql.DB) error {
			_, err := tbl.UpdateVersion(ctx, db, 1, 1, mysql.Set("n", 7))
			return err
		},
		"InTx": func(ctx context.Context, db *sql.DB) error {
			return mysql.InTx(ctx, db, nil, fenceOf("c", 1, "h"), func(ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, `UPDATE counter SET n = 7 WHERE id = 1`)
				return err
			})
		},
		"Once": func(ctx context.Context, db *sql.DB) error {
			_, err := mysql.Once(ctx, db, fenceOf("c", 1, "h"), "k", func(ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, `UPDATE counter SET n = 7 WHERE id = 1`)
				return err
			})
			return err
		},
	}
	for name, call := range calls {
		t.Run(name+"/network blocked", func(t *testing.T) {
			ctx, db, direct, p := proxied(t)
			mustExec(t, ctx, direct, `ALTER TABLE counter ADD COLUMN version BIGINT NOT NULL DEFAULT 1, ADD COLUMN fence_token BIGINT, ADD COLUMN fence_holder VARBINARY(1024)`)
			p.Block()
			callCtx, cancel := context.WithTimeout(ctx, 700*time.Millisecond)
			defer cancel()
			err := call(callCtx, db)
			if err == nil || errors.Is(err, fence.ErrOutcomeUnknown) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("%s with the network blocked = %v, want the deadline and a known outcome", name, err)
			}
			p.Unblock()
			if n, _ := counter(t, ctx, direct); n != 0 {
				t.Fatalf("counter = %d, want 0", n)
			}
		})
		t.Run(name+"/connections reset", func(t *testing.T) {
			ctx, db, direct, p := proxied(t)
			mustExec(t, ctx, direct, `ALTER TABLE counter ADD COLUMN version BIGINT NOT NULL DEFAULT 1, ADD COLUMN fence_token BIGINT, ADD COLUMN fence_holder VARBINARY(1024)`)
			p.CutFor(time.Minute)
			err := call(ctx, db)
			if err == nil || errors.Is(err, fence.ErrOutcomeUnknown) {
				t.Fatalf("%s with every connection reset = %v, want a known outcome", name, err)
			}
			if n, _ := counter(t, ctx, direct); n != 0 {
				t.Fatalf("counter = %d, want 0", n)
			}
		})
		t.Run(name+"/greeting lost", func(t *testing.T) {
			ctx, db, direct, p := proxied(t)
			mustExec(t, ctx, direct, `ALTER TABLE counter ADD COLUMN version BIGINT NOT NULL DEFAULT 1, ADD COLUMN fence_token BIGINT, ADD COLUMN fence_holder VARBINARY(1024)`)
			p.LoseNextReply(nil) // the server speaks first: its greeting
			err := call(ctx, db)
			if errors.Is(err, fence.ErrOutcomeUnknown) {
				t.Fatalf("%s with the greeting lost = %v, want a known outcome", name, err)
			}
			if p.Faults().Lost != 1 {
				t.Fatalf("%d replies lost, want the greeting", p.Faults().Lost)
			}
			// database/sql may dial again and succeed; either way the
			// answer is known and true.
			n, _ := counter(t, ctx, direct)
			if (err == nil) != (n == 7) {
				t.Fatalf("%s = %v with counter %d", name, err, n)
			}
		})
	}
}
