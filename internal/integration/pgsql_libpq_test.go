package integration_test

import (
	"database/sql"
	"testing"

	_ "github.com/lib/pq"

	"github.com/fencekit/fencekit/internal/harness/pgsqlsuite"
)

// TestPgsqlSuiteLibPQ runs storage/pgsql's driver suite through lib/pq.
// lib/pq lives here, in a module of its own, so that fencekit's go.mod
// never requires it: storage/pgsql reads lib/pq's errors through their
// SQLState and Fatal methods, without importing it.
func TestPgsqlSuiteLibPQ(t *testing.T) {
	pgsqlsuite.Run(t, pgsqlsuite.Driver{
		Name: "lib/pq",
		Open: func(u string) (*sql.DB, error) { return sql.Open("postgres", u) },
	})
}
