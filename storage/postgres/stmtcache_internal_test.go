package postgres

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/fence"
)

// TestStatementsKept: a Table's statement is written once per Table and
// value columns and then reused; another column set, table or column name
// gets its own; a Table the checks refuse is refused on every call and
// never kept; a call with more value columns than a key holds is written
// each time, and right.
func TestStatementsKept(t *testing.T) {
	tbl := Table{Name: pgx.Identifier{"kept_s", "kept_t"}, Key: "id"}
	a := []Assignment{Set("a", 1)}
	first, err := tbl.statement(stmtUpdate, a, updateSQL)
	if err != nil {
		t.Fatal(err)
	}
	again, err := tbl.statement(stmtUpdate, []Assignment{Set("a", 2)}, updateSQL)
	if err != nil || again != first {
		t.Fatalf("second call: %p, %v; want the kept statement %p", again, err, first)
	}
	const want = `UPDATE "kept_s"."kept_t" SET "a" = $4, "fence_token" = $2, "fence_holder" = $3 WHERE "id" = $1 AND ("fence_token" IS NULL OR "fence_token" < $2 OR ("fence_token" = $2 AND "fence_holder" = $3))`
	if first.sql != want {
		t.Fatalf("statement:\n%s\nwant\n%s", first.sql, want)
	}
	for name, c := range map[string]struct {
		tbl    Table
		values []Assignment
	}{
		"other column":  {tbl, []Assignment{Set("b", 1)}},
		"more columns":  {tbl, []Assignment{Set("a", 1), Set("b", 1)}},
		"other table":   {Table{Name: pgx.Identifier{"kept_t"}, Key: "id"}, a},
		"other token":   {Table{Name: tbl.Name, Key: "id", Token: "tok"}, a},
		"other key":     {Table{Name: tbl.Name, Key: "id2"}, a},
		"other version": {Table{Name: tbl.Name, Key: "id", Version: "v"}, a},
	} {
		st, err := c.tbl.statement(stmtUpdate, c.values, updateSQL)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if st == first || (name != "other version" && st.sql == first.sql) {
			t.Errorf("%s: given the statement of another call: %s", name, st.sql)
		}
		if want := updateSQL(mustResolve(t, c.tbl, c.values), c.values); st.sql != want {
			t.Errorf("%s: %s, want %s", name, st.sql, want)
		}
	}
	up, err := tbl.statement(stmtUpsert, a, upsertSQL)
	if err != nil || up == first || up.sql != upsertSQL(mustResolve(t, tbl, a), a) {
		t.Fatalf("Upsert given %v (%v), want its own statement", up, err)
	}
	bad := Table{Name: tbl.Name, Key: "fence_token"}
	for range 2 {
		if _, err := bad.statement(stmtUpdate, a, updateSQL); !errors.Is(err, fence.ErrInvalid) {
			t.Fatalf("a Table whose key is its token column: %v, want ErrInvalid", err)
		}
	}
	if k, _ := bad.stmtKey(stmtUpdate, a); func() bool { _, kept := keptStatement(k); return kept }() {
		t.Fatal("a refused Table's statement was kept")
	}
	many := []Assignment{Set("c1", 1), Set("c2", 1), Set("c3", 1), Set("c4", 1), Set("c5", 1)}
	st, err := tbl.statement(stmtUpdate, many, updateSQL)
	if err != nil || st.sql != updateSQL(mustResolve(t, tbl, many), many) {
		t.Fatalf("five value columns: %v, %v", st, err)
	}
	if dup := []Assignment{Set("a", 1), Set("a", 2)}; func() error { _, err := tbl.statement(stmtUpdate, dup, updateSQL); return err }() == nil {
		t.Fatal("a column set twice was not refused")
	}
}

func mustResolve(t *testing.T, tbl Table, values []Assignment) table {
	t.Helper()
	r, err := tbl.resolve(values)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
