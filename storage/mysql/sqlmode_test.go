package mysql_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/storage/mysql"
)

// shortKeys creates short(k VARCHAR(3) PRIMARY KEY, v VARCHAR(3), version,
// fence columns) with row "abc" on connections whose sql_mode is mode.
func shortKeys(t *testing.T, mode string) (context.Context, *sql.DB, mysql.Table) {
	t.Helper()
	cfg := testenv.MySQLConfig(t)
	cfg.Params = map[string]string{"sql_mode": "'" + mode + "'"}
	ctx, db := setupWith(t, cfg)
	mustExec(t, ctx, db, `CREATE TABLE short (k VARCHAR(3) PRIMARY KEY, v VARCHAR(3) NOT NULL DEFAULT '', version BIGINT NOT NULL DEFAULT 1,
fence_token BIGINT, fence_holder VARBINARY(1024))`)
	mustExec(t, ctx, db, `INSERT INTO short (k, v) VALUES ('abc', 'old')`)
	return ctx, db, mysql.Table{Name: "short", Key: "k"}
}

// shortRows returns the table's rows as "k=v@version" in key order.
func shortRows(t *testing.T, ctx context.Context, db *sql.DB) string {
	t.Helper()
	rows, err := db.QueryContext(ctx, `SELECT k, v, version, COALESCE(fence_token, 0) FROM short ORDER BY k`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var k, v string
		var ver, tok int64
		if err := rows.Scan(&k, &v, &ver, &tok); err != nil {
			t.Fatal(err)
		}
		out = append(out, k+"="+v+"@"+string(rune('0'+ver))+"/"+string(rune('0'+tok)))
	}
	return strings.Join(out, " ")
}

// TestTableUnderNonStrictSQLMode: with a sql_mode that truncates instead
// of failing, a Table's statements would write a row under another key (or
// a truncated value) and misreport it. They refuse instead, naming
// sql_mode, and change nothing; under a strict mode the same calls fail as
// the server refuses the values.
func TestTableUnderNonStrictSQLMode(t *testing.T) {
	f := fenceOf("short", 5, "h")
	calls := map[string]func(ctx context.Context, db *sql.DB, tbl mysql.Table) error{
		"Upsert of a key that truncates onto a row": func(ctx context.Context, db *sql.DB, tbl mysql.Table) error {
			return tbl.Upsert(ctx, db, f, "abcdef", mysql.Set("v", "new"))
		},
		"Upsert of a key that truncates to a new one": func(ctx context.Context, db *sql.DB, tbl mysql.Table) error {
			return tbl.Upsert(ctx, db, f, "xyzzz", mysql.Set("v", "new"))
		},
		"Update of a value that truncates": func(ctx context.Context, db *sql.DB, tbl mysql.Table) error {
			return tbl.Update(ctx, db, f, "abc", mysql.Set("v", "toolong"))
		},
		"UpdateVersion of a value that truncates": func(ctx context.Context, db *sql.DB, tbl mysql.Table) error {
			_, err := tbl.UpdateVersion(ctx, db, "abc", 1, mysql.Set("v", "toolong"))
			return err
		},
	}
	const before = "abc=old@1/0"
	for _, mode := range []string{"", "NO_ENGINE_SUBSTITUTION", "ANSI_QUOTES,NO_BACKSLASH_ESCAPES"} {
		for name, call := range calls {
			t.Run(mode+"/"+name, func(t *testing.T) {
				ctx, db, tbl := shortKeys(t, mode)
				err := call(ctx, db, tbl)
				if err == nil || errors.Is(err, fence.ErrNotFound) || !strings.Contains(err.Error(), "sql_mode") {
					t.Fatalf("err = %v, want a refusal that names sql_mode", err)
				}
				if got := shortRows(t, ctx, db); got != before {
					t.Fatalf("rows %q, want %q: nothing changed", got, before)
				}
			})
		}
	}
	for name, call := range calls {
		t.Run("STRICT_TRANS_TABLES/"+name, func(t *testing.T) {
			ctx, db, tbl := shortKeys(t, "STRICT_TRANS_TABLES")
			if err := call(ctx, db, tbl); err == nil || errors.Is(err, fence.ErrNotFound) {
				t.Fatalf("err = %v, want the server's refusal of the value", err)
			}
			if got := shortRows(t, ctx, db); got != before {
				t.Fatalf("rows %q, want %q: nothing changed", got, before)
			}
		})
	}
	// A non-strict mode is refused whatever the values: nothing else can
	// tell which values would be cut short.
	t.Run("a key that fits, under sql_mode ''", func(t *testing.T) {
		ctx, db, tbl := shortKeys(t, "")
		if err := tbl.Upsert(ctx, db, f, "abd", mysql.Set("v", "new")); err == nil || !strings.Contains(err.Error(), "sql_mode") {
			t.Fatalf("Upsert under sql_mode '' = %v, want a refusal that names sql_mode", err)
		}
	})
}

// TestTableRefusesNullKey: a NULL key matches no row, and in a nullable
// unique column never collides, so each Upsert would insert one more row
// and report it not found. Every Table call refuses it before sending,
// naming the call.
func TestTableRefusesNullKey(t *testing.T) {
	ctx, db := setup(t)
	mustExec(t, ctx, db, `CREATE TABLE nk (id INT AUTO_INCREMENT PRIMARY KEY, k VARCHAR(8) NULL UNIQUE, v INT,
version BIGINT NOT NULL DEFAULT 1, fence_token BIGINT, fence_holder VARBINARY(1024))`)
	tbl := mysql.Table{Name: "nk", Key: "k"}
	f := fenceOf("nk", 1, "h")
	var nilPtr *string
	for _, key := range []any{nil, nilPtr, sql.NullString{}} {
		for name, call := range map[string]func() error{
			"Table.Update": func() error { return tbl.Update(ctx, db, f, key, mysql.Set("v", 1)) },
			"Table.Upsert": func() error { return tbl.Upsert(ctx, db, f, key, mysql.Set("v", 1)) },
			"Table.UpdateVersion": func() error {
				_, err := tbl.UpdateVersion(ctx, db, key, 1, mysql.Set("v", 1))
				return err
			},
		} {
			err := call()
			if !errors.Is(err, fence.ErrInvalid) || !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), "NULL key") {
				t.Errorf("%s with key %#v = %v, want fence.ErrInvalid naming the call and the NULL key", name, key, err)
			}
		}
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM nk`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows inserted (%v), want none", n, err)
	}
}
