package pgsqlsuite

import (
	"context"
	"errors"
	"testing"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/storage/pgsql"
)

func init() {
	register(test{"UnencodableArgumentIsNotUnknown", testUnencodableArgument})
}

// testUnencodableArgument: a value that the driver cannot encode (pgx's
// stdlib) or that database/sql cannot convert (lib/pq) fails the call
// before the statement is sent, so the outcome is known: nothing was
// written. A Table call on a *sql.DB or a *sql.Conn must say so plainly,
// not that the outcome is unknown.
func testUnencodableArgument(t *testing.T, d Driver) {
	e, tbl := accounts(t, d)
	conn, err := e.db.Conn(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	bad := struct{ X int }{1}
	for hname, db := range map[string]pgsql.Querier{"*sql.DB": e.db, "*sql.Conn": conn} {
		for name, call := range map[string]func(ctx context.Context) error{
			"Table.Update": func(ctx context.Context) error {
				return tbl.Update(ctx, db, fenceOf("acct", 5, "h"), "a", pgsql.Set("balance", bad))
			},
			"Table.Upsert": func(ctx context.Context) error {
				return tbl.Upsert(ctx, db, fenceOf("acct", 5, "h"), "a", pgsql.Set("balance", bad))
			},
			"Table.UpdateVersion": func(ctx context.Context) error {
				_, err := tbl.UpdateVersion(ctx, db, "a", 1, pgsql.Set("balance", bad))
				return err
			},
		} {
			err := call(e.ctx)
			if err == nil || errors.Is(err, fence.ErrOutcomeUnknown) {
				t.Errorf("%s on a %s with an argument the driver cannot send = %v, want a known outcome", name, hname, err)
			}
		}
	}
	if bal, ver := e.balance("a"); bal != 10 || ver != 1 {
		t.Fatalf("balance %d version %d, want 10 and 1: nothing may be written", bal, ver)
	}
}
