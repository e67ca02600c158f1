package pgsqlsuite

import (
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/storage/pgsql"
)

func init() {
	register(test{"TableRefusesNullKey", testTableRefusesNullKey})
}

// testTableRefusesNullKey: a NULL key matches no row, and a nullable
// unique column holds any number of NULLs, so an Upsert with one inserts a
// new row every time: token 1 after token 9 included. Every Table call
// refuses it before sending, naming the call, whichever form the NULL
// takes (nil, a nil pointer, a driver.Valuer that yields nil, pgx's null
// values).
func testTableRefusesNullKey(t *testing.T, d Driver) {
	e := setup(t, d)
	e.exec(`CREATE TABLE nk (id serial PRIMARY KEY, k text NULL UNIQUE, v int, fence_token bigint, fence_holder text, version bigint NOT NULL DEFAULT 1)`)
	tbl := pgsql.Table{Name: "nk", Key: "k"}
	var nilPtr *string
	var nilText *pgtype.Text
	keys := map[string]any{
		"nil":              nil,
		"nil *string":      nilPtr,
		"sql.NullString":   sql.NullString{},
		"sql.Null[int64]":  sql.Null[int64]{},
		"pgtype.Text":      pgtype.Text{},
		"nil *pgtype.Text": nilText,
	}
	for kname, key := range keys {
		for name, call := range map[string]func(f fence.Fence) error{
			"Table.Update": func(f fence.Fence) error { return tbl.Update(e.ctx, e.db, f, key, pgsql.Set("v", 1)) },
			"Table.Upsert": func(f fence.Fence) error { return tbl.Upsert(e.ctx, e.db, f, key, pgsql.Set("v", 1)) },
			"Table.UpdateVersion": func(fence.Fence) error {
				_, err := tbl.UpdateVersion(e.ctx, e.db, key, 1, pgsql.Set("v", 1))
				return err
			},
		} {
			// The newer fence first: were the key admitted, the older one
			// would land after it.
			for _, tok := range []int64{9, 1} {
				err := call(fenceOf("nk", tok, "h"))
				if !errors.Is(err, fence.ErrInvalid) || !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), "NULL key") {
					t.Errorf("%s with key %s (token %d) = %v, want fence.ErrInvalid naming the call and the NULL key", name, kname, tok, err)
				}
			}
		}
	}
	var n int
	if err := e.db.QueryRowContext(e.ctx, `SELECT count(*) FROM nk`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows inserted (%v), want none", n, err)
	}
}
