package history

import (
	"testing"

	"github.com/anishathalye/porcupine"
)

// myBrokenControl runs the MySQL checker on a broken variant of the guard:
// it must reject most runs.
func myBrokenControl(t *testing.T, name string, variant myVariant) {
	budgetedOnly(t)
	t.Parallel()
	rejectsMost(t, name, func(t *testing.T, b Budget) controlRun {
		res := runMySQL(t, b, variant)
		reportMySQL(t, res)
		res.judged.Require(t, "mysql control", nil)
		return controlRun{rejected: res.verdict.Result == porcupine.Illegal, exposed: res.exposed}
	})
}

// TestMySQLControlTokenGE: the guard admits by token >= instead of >.
func TestMySQLControlTokenGE(t *testing.T) {
	myBrokenControl(t, "mysql guard admitting token >=", myTokenGE)
}

// TestMySQLControlNoHolder: the guard admits the mark's token whatever the
// holder.
func TestMySQLControlNoHolder(t *testing.T) {
	myBrokenControl(t, "mysql guard without the holder compare", myNoHolder)
}

// TestMySQLControlNoRowLock: a guard that reads the mark without a row
// lock, decides, then writes it.
func TestMySQLControlNoRowLock(t *testing.T) {
	myBrokenControl(t, "mysql guard without the row lock", myNoRowLock)
}

// TestMySQLControlOnceAfter: a Once that runs the work, then records it in
// a transaction of its own.
func TestMySQLControlOnceAfter(t *testing.T) {
	myBrokenControl(t, "mysql Once recording after the work", myOnceAfter)
}

// TestMySQLControlSnapshot: InTx's and Once's guard judging the mark from
// the transaction's snapshot instead of a locking read.
func TestMySQLControlSnapshot(t *testing.T) {
	myBrokenControl(t, "mysql guard judging from its snapshot", mySnapshot)
}

// TestMySQLControlOnceNoIgnore: Once's record written by INSERT without
// IGNORE, so that a Once on a done key fails instead of reporting done.
func TestMySQLControlOnceNoIgnore(t *testing.T) {
	myBrokenControl(t, "mysql Once failing on a done key", myOnceNoIgnore)
}
