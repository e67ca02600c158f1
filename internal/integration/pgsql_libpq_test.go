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

// TestPgsqlLibPQBinaryParameters: with binary_parameters=yes lib/pq sends a
// statement with arguments in one round trip, and the guard costs one; the
// round-trip and outcome tests run that way too.
func TestPgsqlLibPQBinaryParameters(t *testing.T) {
	pgsqlsuite.RunOnly(t, pgsqlsuite.Driver{
		Name: "lib/pq binary_parameters",
		Open: func(u string) (*sql.DB, error) { return sql.Open("postgres", u+"&binary_parameters=yes") },
	}, "RoundTrips", "GuardAdmission", "TokenLimit", "CommitReplyLost", "AutocommitReplyLost", "TableUpdateAndUpsert")
}

// BenchmarkPgsqlLibPQ is storage/pgsql's BenchmarkPgxStdlib through
// lib/pq, by default (a statement with arguments costs two round trips) and
// with binary_parameters=yes (one).
//
//	go test -run '^$' -bench PgsqlLibPQ -count 6 ./internal/integration
func BenchmarkPgsqlLibPQ(b *testing.B) {
	b.Run("default", func(b *testing.B) {
		pgsqlsuite.Bench(b, pgsqlsuite.Driver{Name: "lib/pq", Open: func(u string) (*sql.DB, error) { return sql.Open("postgres", u) }})
	})
	b.Run("binary_parameters", func(b *testing.B) {
		pgsqlsuite.Bench(b, pgsqlsuite.Driver{Name: "lib/pq", Open: func(u string) (*sql.DB, error) { return sql.Open("postgres", u+"&binary_parameters=yes") }})
	})
}
