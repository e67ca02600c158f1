package pgsql_test

import (
	"database/sql"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/fencekit/fencekit/internal/harness/pgsqlsuite"
)

// pgxStdlib opens databases through pgx's stdlib driver with its defaults:
// statements prepared once per connection and cached.
var pgxStdlib = pgsqlsuite.Driver{
	Name:      "pgx-stdlib",
	Open:      func(u string) (*sql.DB, error) { return sql.Open("pgx", u) },
	Reprepare: 2,
}

// pgxSimple sends every statement through the simple protocol, arguments
// interpolated by pgx, as a pooler in transaction mode (PgBouncer) needs.
var pgxSimple = pgsqlsuite.Driver{
	Name: "pgx-simple-protocol",
	Open: func(u string) (*sql.DB, error) { return sql.Open("pgx", u+"&default_query_exec_mode=simple_protocol") },
}

// TestSuitePgxStdlib runs the suite every driver must pass through pgx's
// stdlib, with its statement cache and with the simple protocol. lib/pq
// runs it in the integration module.
func TestSuitePgxStdlib(t *testing.T) {
	pgsqlsuite.Run(t, pgxStdlib)
}

func TestSuitePgxSimpleProtocol(t *testing.T) {
	pgsqlsuite.Run(t, pgxSimple)
}
