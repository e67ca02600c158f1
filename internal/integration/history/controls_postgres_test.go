package history

import (
	"testing"

	"github.com/anishathalye/porcupine"
)

// TestPostgresControlNoGuard runs the PostgreSQL checker on an Exec whose
// write runs without the guard: it must reject most runs.
func TestPostgresControlNoGuard(t *testing.T) {
	t.Parallel()
	rejectsMost(t, "write without the guard", func(t *testing.T, b Budget) controlRun {
		res := runPostgres(t, b, pgNoGuard)
		reportPostgres(t, res)
		return controlRun{rejected: res.verdict.Result == porcupine.Illegal, exposed: res.exposed}
	})
}

// TestPostgresControlReadOutside runs the PostgreSQL checker on an InTx
// read-modify-write whose read runs before the guarded transaction: it
// must reject most runs.
func TestPostgresControlReadOutside(t *testing.T) {
	t.Parallel()
	rejectsMost(t, "read outside the guarded transaction", func(t *testing.T, b Budget) controlRun {
		res := runPostgres(t, b, pgReadOutside)
		reportPostgres(t, res)
		return controlRun{rejected: res.verdict.Result == porcupine.Illegal, exposed: res.exposed}
	})
}
