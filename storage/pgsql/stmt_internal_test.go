package pgsql

import (
	"errors"
	"testing"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/sqlguard"
)

// TestStatementsKept: Table.Update's statement is written once per Table
// and value columns and then reused; another column set, schema, table or
// column name gets its own; a Table the checks refuse is refused on every
// call and never kept; a call with more value columns than a key holds is
// written each time, and right.
func TestStatementsKept(t *testing.T) {
	tbl := Table{Schema: "kept_s", Name: "kept_t", Key: "id"}
	a := []Assignment{Set("a", 1)}
	first, err := tbl.statement(stmtUpdate, a, buildUpdate)
	if err != nil {
		t.Fatal(err)
	}
	again, err := tbl.statement(stmtUpdate, []Assignment{Set("a", 2)}, buildUpdate)
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
		"no columns":    {tbl, nil},
		"other schema":  {Table{Name: "kept_t", Key: "id"}, a},
		"other table":   {Table{Schema: "kept_s", Name: "kept_u", Key: "id"}, a},
		"other token":   {Table{Schema: "kept_s", Name: "kept_t", Key: "id", Token: "tok"}, a},
		"other holder":  {Table{Schema: "kept_s", Name: "kept_t", Key: "id", Holder: "who"}, a},
		"other key":     {Table{Schema: "kept_s", Name: "kept_t", Key: "id2"}, a},
		"other version": {Table{Schema: "kept_s", Name: "kept_t", Key: "id", Version: "v"}, a},
	} {
		st, err := c.tbl.statement(stmtUpdate, c.values, buildUpdate)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if st == first || (name != "other version" && st.sql == first.sql) {
			t.Errorf("%s: given the statement of another call: %s", name, st.sql)
		}
		r := mustResolve(t, c.tbl, c.values)
		if want := buildUpdate(r, c.values); st.sql != want || st.table != r {
			t.Errorf("%s: %s (%+v), want %s (%+v)", name, st.sql, st.table, want, r)
		}
	}
	bad := Table{Name: "kept_t", Key: "fence_token"}
	for range 2 {
		if _, err := bad.statement(stmtUpdate, a, buildUpdate); !errors.Is(err, fence.ErrInvalid) {
			t.Fatalf("a Table whose key is its token column: %v, want ErrInvalid", err)
		}
	}
	k, _ := sqlguard.KeyOf(stmtUpdate, bad.Schema, bad.Name, bad.Key, bad.Token, bad.Holder, bad.Version, a, assignmentColumn)
	if _, kept := statements.Load(k); kept {
		t.Fatal("a refused Table's statement was kept")
	}
	many := []Assignment{Set("c1", 1), Set("c2", 1), Set("c3", 1), Set("c4", 1), Set("c5", 1)}
	st, err := tbl.statement(stmtUpdate, many, buildUpdate)
	if err != nil || st.sql != buildUpdate(mustResolve(t, tbl, many), many) {
		t.Fatalf("five value columns: %v, %v", st, err)
	}
	if dup := []Assignment{Set("a", 1), Set("a", 2)}; func() error { _, err := tbl.statement(stmtUpdate, dup, buildUpdate); return err }() == nil {
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
