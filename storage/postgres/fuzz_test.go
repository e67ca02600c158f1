package postgres

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
)

// pgNameLen is the longest identifier PostgreSQL keeps (NAMEDATALEN - 1
// bytes); a longer one is cut to it, at a character boundary.
const pgNameLen = 63

// pgName is the name PostgreSQL keeps for identifier s.
func pgName(s string) string {
	if len(s) <= pgNameLen {
		return s
	}
	n := pgNameLen
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// unquote reads back an identifier quoted by pgx.Identifier.Sanitize.
func unquote(t *testing.T, q string) string {
	t.Helper()
	if len(q) < 2 || q[0] != '"' || q[len(q)-1] != '"' {
		t.Fatalf("%q is not a quoted identifier", q)
	}
	inner := q[1 : len(q)-1]
	if strings.Contains(strings.ReplaceAll(inner, `""`, ""), `"`) {
		t.Fatalf("%q has a lone quote inside", q)
	}
	return strings.ReplaceAll(inner, `""`, `"`)
}

// fuzzTable builds a Table and its values from fuzzed names; parts picks a
// one- or two-part table name and how many value columns there are.
func fuzzTable(parts uint8, schema, name, key, token, holder, version, col string) (Table, []Assignment) {
	tbl := Table{Name: pgx.Identifier{name}, Key: key, Token: token, Holder: holder, Version: version}
	if parts&1 != 0 {
		tbl.Name = pgx.Identifier{schema, name}
	}
	var values []Assignment
	if parts&2 != 0 {
		values = append(values, Set(col, "v"))
	}
	return tbl, values
}

// resolveSpec is resolve's rule, written out again from Table's doc: every
// name non-empty and without NUL; key, token, holder and version (after
// defaults) four different columns; each value naming another column once.
func resolveSpec(tbl Table, values []Assignment) bool {
	ok := func(s string) bool { return s != "" && !strings.ContainsRune(s, 0) }
	if len(tbl.Name) < 1 || len(tbl.Name) > 2 {
		return false
	}
	for _, p := range tbl.Name {
		if !ok(p) {
			return false
		}
	}
	seen := map[string]bool{}
	for _, c := range []string{tbl.Key, orDefault(tbl.Token, DefaultTokenColumn), orDefault(tbl.Holder, DefaultHolderColumn), orDefault(tbl.Version, DefaultVersionColumn)} {
		if !ok(c) || seen[pgName(c)] {
			return false
		}
		seen[pgName(c)] = true
	}
	for _, v := range values {
		if !ok(v.Column) || seen[pgName(v.Column)] {
			return false
		}
		seen[pgName(v.Column)] = true
	}
	return true
}

var fuzzSeeds = []struct {
	parts                                             uint8
	schema, name, key, token, holder, version, column string
}{
	{2, "", "t", "id", "", "", "", "n"},
	{3, "s", "t", "id", "tok", "hold", "ver", "n"},
	{2, "", `a"b`, `"`, `""`, "x y", "ÿ", `n"; DROP TABLE t; --`},
	{0, "", "t", "id", "id", "", "", ""},
	{2, "", "t", "id", "", "", "", "fence_token"},
	{2, "", "t\x00", "id", "", "", "", "n"},
	{2, "", "t", "id", "", "", "", ""},
	{2, "", strings.Repeat("t", 70), strings.Repeat("k", 64) + "1", strings.Repeat("c", 64) + "2", "", "", strings.Repeat("é", 40)},
}

// FuzzTableResolve: a Table is refused (with errInvalidArgument) exactly
// when its doc says, and every name of one it accepts is quoted so that it
// reads back as itself and names a column of its own, also as PostgreSQL
// keeps it (cut to 63 bytes).
func FuzzTableResolve(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s.parts, s.schema, s.name, s.key, s.token, s.holder, s.version, s.column)
	}
	f.Fuzz(func(t *testing.T, parts uint8, schema, name, key, token, holder, version, col string) {
		tbl, values := fuzzTable(parts, schema, name, key, token, holder, version, col)
		r, err := tbl.resolve(values)
		if want := resolveSpec(tbl, values); (err == nil) != want {
			t.Fatalf("resolve(%#v, %v) = %v, want accepted=%v", tbl, values, err, want)
		}
		if err != nil {
			if !errors.Is(err, errInvalidArgument) {
				t.Fatalf("resolve(%#v) = %v, not errInvalidArgument", tbl, err)
			}
			return
		}
		if got := r.name; got != tbl.Name.Sanitize() {
			t.Fatalf("table %q quoted as %q", tbl.Name, got)
		}
		for _, p := range tbl.Name {
			if q := (pgx.Identifier{p}).Sanitize(); unquote(t, q) != p {
				t.Fatalf("table part %q quoted as %q", p, q)
			}
		}
		cols := []struct{ role, quoted, name string }{
			{"key", r.key, tbl.Key},
			{"token", r.token, orDefault(tbl.Token, DefaultTokenColumn)},
			{"holder", r.holder, orDefault(tbl.Holder, DefaultHolderColumn)},
			{"version", r.version, orDefault(tbl.Version, DefaultVersionColumn)},
		}
		for _, v := range values {
			cols = append(cols, struct{ role, quoted, name string }{"value", pgx.Identifier{v.Column}.Sanitize(), v.Column})
		}
		kept := map[string]string{}
		for _, c := range cols {
			if got := unquote(t, c.quoted); got != c.name {
				t.Fatalf("%s column %q quoted as %q, which reads back as %q", c.role, c.name, c.quoted, got)
			}
			if !utf8.ValidString(c.name) {
				continue // the server refuses the name; nothing can be confused
			}
			if other, dup := kept[pgName(c.name)]; dup {
				t.Fatalf("table %q accepted, but its %s and %s columns are one column in PostgreSQL, %q (names are cut to %d bytes)",
					tbl.Name, other, c.role, pgName(c.name), pgNameLen)
			}
			kept[pgName(c.name)] = c.role
		}
	})
}

// FuzzTableRoundTrip: on the real server, a table whose names are fuzzed
// is created by those names, and every Table method writes and reads back
// exactly what was asked, or is refused with a documented error before
// anything is sent.
func FuzzTableRoundTrip(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s.parts, s.name, s.key, s.token, s.holder, s.version, s.column, "data")
	}
	pool := testenv.Postgres(f)
	var seq atomic.Int64
	f.Fuzz(func(t *testing.T, parts uint8, name, key, token, holder, version, col, data string) {
		// One-part names: the test's own schema is the search path.
		tbl, values := fuzzTable(parts&2, "", name+"_"+strconv.FormatInt(seq.Add(1), 10), key, token, holder, version, col)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// Values are not what is fuzzed here: keep them storable as text.
		data = strings.ReplaceAll(strings.ToValidUTF8(data, "?"), "\x00", "")
		f1 := fence.Fence{Resource: "r", Token: 5, Holder: "h1"}
		if !resolveSpec(tbl, values) {
			err := tbl.Update(ctx, pool, f1, "k", values...)
			if !errors.Is(err, errInvalidArgument) {
				t.Fatalf("Update on invalid %#v: %v, want errInvalidArgument", tbl, err)
			}
			return
		}
		r, err := tbl.resolve(values)
		if err != nil {
			t.Fatal(err)
		}
		ddl := "CREATE TABLE " + r.name + " (" + r.key + " text PRIMARY KEY, " + r.token + " bigint, " + r.holder + " text, " + r.version + " bigint NOT NULL DEFAULT 0"
		var valueCol string
		if len(values) > 0 {
			valueCol = pgx.Identifier{values[0].Column}.Sanitize()
			ddl += ", " + valueCol + " text"
		}
		ddl += ")"
		// Everything runs in one transaction that is rolled back: a table
		// per input costs no catalog write that outlives it.
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(context.Background())
		if _, err := tx.Exec(ctx, ddl); err != nil {
			var pe *pgconn.PgError
			if errors.As(err, &pe) && pe.Code == "42701" {
				// Column names that differ become one column on the server.
				t.Fatalf("Table %#v is accepted, but the server makes one column of two: %v", tbl, err)
			}
			return // a name the server refuses (bad encoding): nothing to confuse
		}
		read := func() (tok *int64, hold *string, ver int64, val *string) {
			t.Helper()
			sel := "SELECT " + r.token + ", " + r.holder + ", " + r.version
			if valueCol != "" {
				sel += ", " + valueCol
			} else {
				sel += ", NULL::text"
			}
			if err := tx.QueryRow(ctx, sel+" FROM "+r.name+" WHERE "+r.key+" = $1", "k").Scan(&tok, &hold, &ver, &val); err != nil {
				t.Fatalf("read back %#v: %v", tbl, err)
			}
			return
		}
		vals := func(v string) []Assignment {
			if valueCol == "" {
				return nil
			}
			return []Assignment{Set(values[0].Column, v)}
		}
		if err := tbl.Upsert(ctx, tx, f1, "k", vals(data)...); err != nil {
			t.Fatalf("Upsert on %#v: %v", tbl, err)
		}
		tok, hold, _, val := read()
		if tok == nil || *tok != 5 || hold == nil || *hold != "h1" || (valueCol != "" && (val == nil || *val != data)) {
			t.Fatalf("after Upsert on %#v: token %v, holder %v, value %v", tbl, tok, hold, val)
		}
		stale := fence.Fence{Resource: "r", Token: 4, Holder: "h0"}
		if err := tbl.Update(ctx, tx, stale, "k", vals("stale")...); !errors.Is(err, fence.ErrStale) {
			t.Fatalf("stale Update on %#v: %v", tbl, err)
		}
		f2 := fence.Fence{Resource: "r", Token: 6, Holder: "h2"}
		if err := tbl.Update(ctx, tx, f2, "k", vals(data+"2")...); err != nil {
			t.Fatalf("Update on %#v: %v", tbl, err)
		}
		tok, hold, ver, val := read()
		if *tok != 6 || *hold != "h2" || (valueCol != "" && *val != data+"2") {
			t.Fatalf("after Update on %#v: token %d, holder %q, value %v", tbl, *tok, *hold, val)
		}
		next, err := tbl.UpdateVersion(ctx, tx, "k", ver, vals(data+"3")...)
		if err != nil || next != ver+1 {
			t.Fatalf("UpdateVersion on %#v: %d, %v", tbl, next, err)
		}
		tok, _, ver2, val := read()
		if ver2 != ver+1 || *tok != 6 || (valueCol != "" && *val != data+"3") {
			t.Fatalf("after UpdateVersion on %#v: version %d, token %d, value %v", tbl, ver2, *tok, val)
		}
		if _, err := tbl.UpdateVersion(ctx, tx, "k", ver, vals("late")...); !errors.Is(err, fence.ErrConflict) {
			t.Fatalf("UpdateVersion at an old version on %#v: %v", tbl, err)
		}
	})
}
