package mysql_test

import (
	"database/sql"
	"testing"

	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/storage/mysql"
)

// TestIsolationMatrix runs the hand-over that InnoDB's snapshots make
// dangerous at each isolation level: holder A (token 1) has guarded, read
// and written the counter but not yet committed when holder B (token 2)
// starts its transaction. B's guard waits for A's commit.
//
// With the guard first, B's reads come after A's commit at every level and
// nothing is lost. The negative controls read before the guard: B then
// writes from a value older than A's commit (lost at READ COMMITTED and
// REPEATABLE READ), and at REPEATABLE READ even a read made after the guard
// returns the old snapshot. SERIALIZABLE turns B's plain read into a
// locking read that waits for A, so it loses nothing either way.
func TestIsolationMatrix(t *testing.T) {
	testenv.Slow(t)
	const lost, kept = 1, 2 // the counter after both increments
	levels := []struct {
		name  string
		level sql.IsolationLevel
		// The final counter for each way of reading.
		guardFirst, readThenGuard, readGuardReread int64
	}{
		{"READ COMMITTED", sql.LevelReadCommitted, kept, lost, kept},
		{"REPEATABLE READ", sql.LevelRepeatableRead, kept, lost, lost},
		{"SERIALIZABLE", sql.LevelSerializable, kept, kept, kept},
	}
	type order int
	const (
		guardFirst order = iota
		readThenGuard
		readGuardReread
	)
	orders := []struct {
		name  string
		order order
	}{
		{"guard first", guardFirst},
		{"read, guard, write what was read (negative control)", readThenGuard},
		{"read, guard, read again, write (negative control)", readGuardReread},
	}
	for _, lv := range levels {
		for _, o := range orders {
			want := map[order]int64{guardFirst: lv.guardFirst, readThenGuard: lv.readThenGuard, readGuardReread: lv.readGuardReread}[o.order]
			t.Run(lv.name+"/"+o.name, func(t *testing.T) {
				ctx, db := setup(t)
				a, b := fenceOf("counter", 1, "A"), fenceOf("counter", 2, "B")
				read := func(tx *sql.Tx) (int64, error) {
					var n int64
					err := tx.QueryRowContext(ctx, `SELECT n FROM counter WHERE id = 1`).Scan(&n)
					return n, err
				}

				txA, _ := begin(t, ctx, db, lv.level)
				if err := mysql.Guard(ctx, txA, a); err != nil {
					t.Fatal(err)
				}
				n, err := read(txA)
				if err != nil {
					t.Fatal(err)
				}
				mustExec(t, ctx, txA, `UPDATE counter SET n = ?, writer = 1 WHERE id = 1`, n+1)

				txB, idB := begin(t, ctx, db, lv.level)
				done := make(chan error, 1)
				go func() {
					done <- func() error {
						var n int64
						var err error
						if o.order != guardFirst {
							if n, err = read(txB); err != nil {
								return err
							}
						}
						if err := mysql.Guard(ctx, txB, b); err != nil {
							return err
						}
						if o.order != readThenGuard {
							if n, err = read(txB); err != nil {
								return err
							}
						}
						if _, err := txB.ExecContext(ctx, `UPDATE counter SET n = ?, writer = 2 WHERE id = 1`, n+1); err != nil {
							return err
						}
						return txB.Commit()
					}()
				}()
				waitBlocked(t, ctx, db, idB) // on A's guard row, or on A's counter row
				if err := txA.Commit(); err != nil {
					t.Fatal(err)
				}
				if err := <-done; err != nil {
					t.Fatalf("holder B: %v", err)
				}
				n, writer := counter(t, ctx, db)
				if n != want || writer != 2 {
					t.Fatalf("counter = %d written by %d, want %d written by B (2 means no increment was lost)", n, writer, want)
				}
			})
		}
	}
}
