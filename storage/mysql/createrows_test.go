package mysql_test

import (
	"testing"

	"github.com/fencekit/fencekit/storage/mysql"
)

// TestCreateGuardRowsLeavesAMarkedRow: creating a guard row never touches
// a row that exists, whether it was committed before CreateGuardRows
// looked, or inserted with a mark by a transaction that commits while
// CreateGuardRows waits to create it. InTx and Once create their missing
// rows with the same statement.
func TestCreateGuardRowsLeavesAMarkedRow(t *testing.T) {
	ctx, db := setup(t)
	marked := fenceOf("r", 5, "a")
	raise(t, ctx, db, marked)
	if err := mysql.CreateGuardRows(ctx, db, "r"); err != nil {
		t.Fatal(err)
	}
	if got := mark(t, ctx, db, "r"); got != marked {
		t.Fatalf("mark after CreateGuardRows of a marked row = %v, want %v", got, marked)
	}

	// A Guard inserts r2's row with its mark and has not committed: the
	// row is not there for CreateGuardRows's look, and its insert waits.
	inserting := fenceOf("r2", 7, "b")
	tx1, _ := begin(t, ctx, db, 0)
	if err := mysql.Guard(ctx, tx1, inserting); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mysql.CreateGuardRows(ctx, db, "r2") }()
	waitAnyBlocked(t, ctx, db, done)
	if err := tx1.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := mark(t, ctx, db, "r2"); got != inserting {
		t.Fatalf("mark after CreateGuardRows met a row being inserted = %v, want %v", got, inserting)
	}
}
