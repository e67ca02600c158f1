package pgsql_test

import (
	"testing"

	"github.com/fencekit/fencekit/internal/harness/pgsqlsuite"
)

// BenchmarkPgxStdlib compares a fenced write with the same plain one
// through pgx's stdlib (statement cache, and simple protocol). lib/pq's
// figures come from BenchmarkPgsqlLibPQ in the integration module.
//
//	go test -run '^$' -bench . -count 6 ./storage/pgsql
func BenchmarkPgxStdlib(b *testing.B) {
	b.Run("cache", func(b *testing.B) { pgsqlsuite.Bench(b, pgxStdlib) })
	b.Run("simple", func(b *testing.B) { pgsqlsuite.Bench(b, pgxSimple) })
}
