package pgsqlsuite

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/storage/pgsql"
)

func init() {
	register(
		test{"TableUpdateAndUpsert", testTableUpdate},
		test{"TableUpdateVersion", testTableUpdateVersion},
		test{"TableMissingColumnsSayWhatToRun", testTableMissingColumns},
	)
}

func accounts(t *testing.T, d Driver) (*env, pgsql.Table) {
	e := setup(t, d)
	e.exec(`CREATE TABLE accounts (id text PRIMARY KEY, balance bigint NOT NULL, fence_token bigint, fence_holder text, version bigint NOT NULL DEFAULT 1)`)
	e.exec(`INSERT INTO accounts (id, balance) VALUES ('a', 10)`)
	return e, pgsql.Table{Name: "accounts", Key: "id"}
}

func (e *env) balance(key string) (bal, ver int64) {
	e.t.Helper()
	if err := e.db.QueryRowContext(e.ctx, `SELECT balance, version FROM accounts WHERE id = $1`, key).Scan(&bal, &ver); err != nil {
		e.t.Fatal(err)
	}
	return bal, ver
}

// testTableUpdate: a row's own mark admits by the rule, refuses with the
// row's mark, tells a missing row apart; Upsert inserts, updates and
// refuses the same way.
func testTableUpdate(t *testing.T, d Driver) {
	e, tbl := accounts(t, d)
	f5 := fenceOf("acct", 5, "a")
	if err := tbl.Update(e.ctx, e.db, f5, "a", pgsql.Set("balance", 20)); err != nil {
		t.Fatal(err)
	}
	if err := tbl.Update(e.ctx, e.db, f5, "a", pgsql.Set("balance", 21)); err != nil {
		t.Fatalf("same fence again: %v", err)
	}
	err := tbl.Update(e.ctx, e.db, fenceOf("acct", 4, "b"), "a", pgsql.Set("balance", 99))
	wantStale(t, err, f5)
	err = tbl.Update(e.ctx, e.db, fenceOf("acct", 5, "b"), "a", pgsql.Set("balance", 99))
	wantStale(t, err, f5)
	if bal, _ := e.balance("a"); bal != 21 {
		t.Fatalf("balance = %d, want 21", bal)
	}
	err = tbl.Update(e.ctx, e.db, f5, "nobody", pgsql.Set("balance", 1))
	if !errors.Is(err, fence.ErrNotFound) || errors.Is(err, fence.ErrStale) {
		t.Fatalf("missing row: %v, want ErrNotFound", err)
	}
	// In a transaction: a fenced read (no values) locks the row.
	tx := e.begin(sql.LevelDefault)
	if err := tbl.Update(e.ctx, tx, fenceOf("acct", 6, "c"), "a"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	// Upsert: insert, admitted update, refusal.
	if err := tbl.Upsert(e.ctx, e.db, fenceOf("acct", 1, "x"), "b", pgsql.Set("balance", 1)); err != nil {
		t.Fatal(err)
	}
	if err := tbl.Upsert(e.ctx, e.db, fenceOf("acct", 2, "y"), "b", pgsql.Set("balance", 2)); err != nil {
		t.Fatal(err)
	}
	err = tbl.Upsert(e.ctx, e.db, fenceOf("acct", 1, "x"), "b", pgsql.Set("balance", 3))
	wantStale(t, err, fenceOf("acct", 2, "y"))
	if bal, _ := e.balance("b"); bal != 2 {
		t.Fatalf("balance of b = %d, want 2", bal)
	}
}

// testTableUpdateVersion: the version compares and bumps; a conflict
// carries the version found; NULL and missing rows are told apart.
func testTableUpdateVersion(t *testing.T, d Driver) {
	e, tbl := accounts(t, d)
	next, err := tbl.UpdateVersion(e.ctx, e.db, "a", 1, pgsql.Set("balance", 11))
	if err != nil || next != 2 {
		t.Fatalf("UpdateVersion = %d, %v; want 2", next, err)
	}
	_, err = tbl.UpdateVersion(e.ctx, e.db, "a", 1, pgsql.Set("balance", 12))
	var ce *fence.ConflictError
	if !errors.As(err, &ce) || ce.Actual != 2 || ce.Expected != 1 {
		t.Fatalf("stale version: %v, want a conflict with version 2", err)
	}
	if _, err := tbl.UpdateVersion(e.ctx, e.db, "zz", 1); !errors.Is(err, fence.ErrNotFound) {
		t.Fatalf("missing row: %v", err)
	}
	e.exec(`CREATE TABLE nullable (id text PRIMARY KEY, version bigint)`)
	e.exec(`INSERT INTO nullable (id) VALUES ('n')`)
	if _, err := (pgsql.Table{Name: "nullable", Key: "id"}).UpdateVersion(e.ctx, e.db, "n", 1); !errors.Is(err, pgsql.ErrNullVersion) {
		t.Fatalf("NULL version: %v, want ErrNullVersion", err)
	}
	// Retry rereads and gets through.
	err = pgsql.Retry(e.ctx, 0, func(ctx context.Context) error {
		bal, ver := e.balance("a")
		_, err := tbl.UpdateVersion(ctx, e.db, "a", ver, pgsql.Set("balance", bal+1))
		return err
	})
	if bal, ver := e.balance("a"); err != nil || bal != 12 || ver != 3 {
		t.Fatalf("Retry: %v, balance %d version %d", err, bal, ver)
	}
}

// testTableMissingColumnsSayWhatToRun: a table without the mark's columns,
// or without the version column, gets the ALTER TABLE to run.
func testTableMissingColumns(t *testing.T, d Driver) {
	e := setup(t, d)
	e.exec(`CREATE TABLE plain (id text PRIMARY KEY, balance bigint)`)
	e.exec(`INSERT INTO plain (id, balance) VALUES ('a', 1)`)
	tbl := pgsql.Table{Name: "plain", Key: "id"}
	err := tbl.Update(e.ctx, e.db, fenceOf("r", 1, "h"), "a", pgsql.Set("balance", 2))
	const wantMark = `pgsql: fenced update of "plain": table "plain" lacks the columns of the row's fence (missing fence_token, fence_holder); add them with ALTER TABLE "plain" ADD COLUMN IF NOT EXISTS "fence_token" bigint, ADD COLUMN IF NOT EXISTS "fence_holder" text, or name the table's own in Table.Token and Table.Holder: `
	if err == nil || !strings.HasPrefix(err.Error(), wantMark) || errors.Is(err, fence.ErrOutcomeUnknown) {
		t.Fatalf("Update without mark columns:\n%v\nwant a message starting\n%s", err, wantMark)
	}
	err = tbl.Upsert(e.ctx, e.db, fenceOf("r", 1, "h"), "b", pgsql.Set("balance", 2))
	if err == nil || !strings.Contains(err.Error(), `ALTER TABLE "plain" ADD COLUMN IF NOT EXISTS "fence_token" bigint`) {
		t.Fatalf("Upsert without mark columns: %v", err)
	}
	_, err = tbl.UpdateVersion(e.ctx, e.db, "a", 1, pgsql.Set("balance", 2))
	const wantVersion = `pgsql: versioned update of "plain": table "plain" lacks the version column "version"; add it with ALTER TABLE "plain" ADD COLUMN IF NOT EXISTS "version" bigint NOT NULL DEFAULT 1, or name the table's own in Table.Version: `
	if err == nil || !strings.HasPrefix(err.Error(), wantVersion) {
		t.Fatalf("UpdateVersion without a version column:\n%v\nwant a message starting\n%s", err, wantVersion)
	}
	// Once the statement given is run, the write goes through; the
	// caller's own missing column is then the server's error alone.
	e.exec(`ALTER TABLE "plain" ADD COLUMN IF NOT EXISTS "fence_token" bigint, ADD COLUMN IF NOT EXISTS "fence_holder" text`)
	if err := tbl.Update(e.ctx, e.db, fenceOf("r", 1, "h"), "a", pgsql.Set("balance", 2)); err != nil {
		t.Fatalf("Update after the ALTER TABLE given: %v", err)
	}
	err = tbl.Update(e.ctx, e.db, fenceOf("r", 1, "h"), "a", pgsql.Set("nope", 2))
	if err == nil || strings.Contains(err.Error(), "ALTER TABLE") {
		t.Fatalf("caller's missing column: %v, want no ALTER TABLE hint", err)
	}
}
