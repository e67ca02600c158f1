package history

import (
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// pgControlLeast is the least a run of a PostgreSQL control lasts.
const pgControlLeast = 6 * time.Second

// TestPostgresControlNoGuard runs the PostgreSQL checker on an Exec whose
// write runs without the guard: it must reject most runs.
func TestPostgresControlNoGuard(t *testing.T) {
	t.Parallel()
	rejectsMostIn(t, "write without the guard", pgControlLeast, func(t *testing.T, b Budget) controlRun {
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
	rejectsMostIn(t, "read outside the guarded transaction", pgControlLeast, func(t *testing.T, b Budget) controlRun {
		res := runPostgres(t, b, pgReadOutside)
		reportPostgres(t, res)
		return controlRun{rejected: res.verdict.Result == porcupine.Illegal, exposed: res.exposed}
	})
}

// pgBrokenControl runs the PostgreSQL checker on a broken variant of the
// guards: it must reject most runs.
func pgBrokenControl(t *testing.T, name string, variant pgVariant) {
	budgetedOnly(t)
	t.Parallel()
	pgRejectsMost(t, name, variant)
}

// pgRejectsMost is pgBrokenControl's check, in the caller's test.
func pgRejectsMost(t *testing.T, name string, variant pgVariant) {
	rejectsMostIn(t, name, pgControlLeast, func(t *testing.T, b Budget) controlRun {
		res := runPostgres(t, b, variant)
		reportPostgres(t, res)
		res.judged.Require(t, "postgres control", nil)
		return controlRun{rejected: res.verdict.Result == porcupine.Illegal, exposed: res.exposed}
	})
}

// TestPostgresControlTokenGE: the guards admit by token >= instead of >.
func TestPostgresControlTokenGE(t *testing.T) {
	pgBrokenControl(t, "guards admitting token >=", pgTokenGE)
}

// TestPostgresControlNoHolder: the guards admit the mark's token whatever
// the holder.
func TestPostgresControlNoHolder(t *testing.T) {
	pgBrokenControl(t, "guards without the holder compare", pgNoHolder)
}

// TestPostgresControlNoRowLock: a guard that reads the mark without a row
// lock, decides, then writes it.
func TestPostgresControlNoRowLock(t *testing.T) {
	pgBrokenControl(t, "guard without the row lock", pgNoRowLock)
}

// TestPostgresControlOnceAfter: a Once that runs the work, then records it
// in a transaction of its own.
func TestPostgresControlOnceAfter(t *testing.T) {
	pgBrokenControl(t, "Once recording after the work", pgOnceAfter)
}

// TestPostgresControlSnapshot: a guard that locks the row but judges the
// holder of the mark from its statement's snapshot, in the transaction's
// guard and in the batch guard's function.
func TestPostgresControlSnapshot(t *testing.T) {
	pgBrokenControl(t, "guards judging from their snapshot", pgSnapshot)
}

// TestPostgresControlLockOnly: the guard that only locks its row under the
// fence that holds the mark (the guards' code before every admission wrote
// the row), in the REPEATABLE READ shape (pgRRShape), which the guards as
// shipped must pass first: so the control's rejections are the variant's.
func TestPostgresControlLockOnly(t *testing.T) {
	budgetedOnly(t)
	t.Parallel()
	b := controlBudget(t)
	b.Duration = max(b.Duration/time.Duration(controlRuns(t)), pgControlLeast)
	res := runPostgres(t, b, pgRRShape)
	reportPostgres(t, res)
	if res.verdict.Result != porcupine.Ok {
		t.Fatalf("the guards as shipped, in the REPEATABLE READ shape, were rejected (seed %d): %s, %s", b.Seed, res.verdict.File, res.verdict.Text)
	}
	pgRejectsMost(t, "guards that only lock the row under the holding fence, at REPEATABLE READ", pgLockOnly)
}

// TestPgsqlControlLockOnly is TestPostgresControlLockOnly for storage/pgsql.
func TestPgsqlControlLockOnly(t *testing.T) {
	budgetedOnly(t)
	t.Parallel()
	b := controlBudget(t)
	b.Duration = max(b.Duration/time.Duration(controlRuns(t)), pgsqlControlLeast)
	res := runPgsql(t, b, pgRRShape)
	reportPgsql(t, res)
	if res.verdict.Result != porcupine.Ok {
		t.Fatalf("the pgsql guards as shipped, in the REPEATABLE READ shape, were rejected (seed %d): %s, %s", b.Seed, res.verdict.File, res.verdict.Text)
	}
	pgsqlRejectsMost(t, "pgsql: guards that only lock the row under the holding fence, at REPEATABLE READ", pgLockOnly)
}
