package mysql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/storage/mysql"
)

const hostileName = "x`; DROP TABLE y; --"

func q(s string) string { return "`" + strings.ReplaceAll(s, "`", "``") + "`" }

// accounts creates a table named hostileName with hostile column names too,
// next to a table y that must survive every call, on a connection with the
// given found-rows setting.
func accounts(t *testing.T, foundRows bool) (context.Context, *sql.DB, mysql.Table) {
	t.Helper()
	cfg := testenv.MySQLConfig(t)
	cfg.ClientFoundRows = foundRows
	ctx, db := setupWith(t, cfg)
	tbl := mysql.Table{
		Name:    hostileName,
		Key:     "id`--",
		Token:   "tok`; DROP TABLE y; --",
		Holder:  "holder",
		Version: "ver sion",
	}
	mustExec(t, ctx, db, `CREATE TABLE y (v INT)`)
	mustExec(t, ctx, db, `CREATE TABLE `+q(hostileName)+` (`+q(tbl.Key)+` VARCHAR(64) PRIMARY KEY, balance BIGINT NOT NULL DEFAULT 0, `+
		q(tbl.Token)+` BIGINT, `+q(tbl.Holder)+` VARBINARY(1024), `+q(tbl.Version)+` BIGINT DEFAULT 1)`)
	mustExec(t, ctx, db, `INSERT INTO `+q(hostileName)+` (`+q(tbl.Key)+`) VALUES ('k')`)
	t.Cleanup(func() {
		if err := db.QueryRowContext(context.Background(), `SELECT COUNT(*) FROM y`).Scan(new(int)); err != nil {
			t.Errorf("table y did not survive: %v", err)
		}
	})
	return ctx, db, tbl
}

func balance(t *testing.T, ctx context.Context, db mysql.Querier, tbl mysql.Table, key string) (bal, ver int64) {
	t.Helper()
	err := db.QueryRowContext(ctx, `SELECT balance, `+q(tbl.Version)+` FROM `+q(hostileName)+` WHERE `+q(tbl.Key)+` = ?`, key).Scan(&bal, &ver)
	if err != nil {
		t.Fatal(err)
	}
	return bal, ver
}

func rowMark(t *testing.T, ctx context.Context, db mysql.Querier, tbl mysql.Table, key string) fence.Fence {
	t.Helper()
	var tok sql.NullInt64
	var h sql.NullString
	err := db.QueryRowContext(ctx, `SELECT `+q(tbl.Token)+`, `+q(tbl.Holder)+` FROM `+q(hostileName)+` WHERE `+q(tbl.Key)+` = ?`, key).Scan(&tok, &h)
	if err != nil {
		t.Fatal(err)
	}
	return fence.Fence{Resource: "acct", Token: fence.Token(tok.Int64), Holder: h.String}
}

// TestTableAdmission runs the admission rule through Update and Upsert, on
// an existing row, under both found-rows settings.
func TestTableAdmission(t *testing.T) {
	hwm := fenceOf("acct", 5, "a")
	tests := []struct {
		name    string
		f       fence.Fence
		admit   bool
		newMark fence.Fence
	}{
		{"lower token is stale", fenceOf("acct", 4, "a"), false, hwm},
		{"equal token same holder is admitted", fenceOf("acct", 5, "a"), true, hwm},
		{"equal token other holder is stale", fenceOf("acct", 5, "b"), false, hwm},
		{"higher token is admitted", fenceOf("acct", 6, "b"), true, fenceOf("acct", 6, "b")},
	}
	for _, foundRows := range []bool{false, true} {
		for _, method := range []string{"Update", "Upsert"} {
			for _, tt := range tests {
				t.Run(foundRowsName(foundRows)+"/"+method+"/"+tt.name, func(t *testing.T) {
					ctx, db, tbl := accounts(t, foundRows)
					write := tbl.Update
					if method == "Upsert" {
						write = tbl.Upsert
					}
					if err := write(ctx, db, hwm, "k", mysql.Set("balance", 10)); err != nil {
						t.Fatalf("first write: %v", err)
					}
					// Writing the same values again changes nothing, which
					// MySQL counts as 0 rows without found rows.
					err := write(ctx, db, tt.f, "k", mysql.Set("balance", 10))
					if tt.admit {
						if err != nil {
							t.Fatalf("%s(%v) with the same values = %v, want admitted", method, tt.f, err)
						}
						if err := write(ctx, db, tt.f, "k", mysql.Set("balance", 20)); err != nil {
							t.Fatalf("%s(%v) = %v, want admitted", method, tt.f, err)
						}
					} else {
						wantStale(t, err, hwm)
						wantStale(t, write(ctx, db, tt.f, "k", mysql.Set("balance", 20)), hwm)
					}
					want := int64(10)
					if tt.admit {
						want = 20
					}
					if bal, _ := balance(t, ctx, db, tbl, "k"); bal != want {
						t.Fatalf("balance = %d, want %d", bal, want)
					}
					if got := rowMark(t, ctx, db, tbl, "k"); got != tt.newMark {
						t.Fatalf("row mark = %v, want %v", got, tt.newMark)
					}
				})
			}
		}
	}
}

// TestTableMissingRowIsNotStale tells a missing row from a refusal, and
// shows that Upsert inserts it with the fence as its mark.
func TestTableMissingRowIsNotStale(t *testing.T) {
	for _, foundRows := range []bool{false, true} {
		t.Run(foundRowsName(foundRows), func(t *testing.T) {
			ctx, db, tbl := accounts(t, foundRows)
			f := fenceOf("acct", 3, "h")
			err := tbl.Update(ctx, db, f, "nope", mysql.Set("balance", 1))
			if !errors.Is(err, fence.ErrNotFound) || errors.Is(err, fence.ErrStale) {
				t.Fatalf("Update of a missing row = %v, want ErrNotFound", err)
			}
			if err := tbl.Upsert(ctx, db, f, "new", mysql.Set("balance", 7)); err != nil {
				t.Fatalf("Upsert of a new row: %v", err)
			}
			if bal, _ := balance(t, ctx, db, tbl, "new"); bal != 7 {
				t.Fatalf("balance = %d, want 7", bal)
			}
			if got := rowMark(t, ctx, db, tbl, "new"); got != f {
				t.Fatalf("row mark = %v, want %v", got, f)
			}
			wantStale(t, tbl.Upsert(ctx, db, fenceOf("acct", 2, "h"), "new", mysql.Set("balance", 8)), f)
			if _, err := tbl.UpdateVersion(ctx, db, "nope", 1); !errors.Is(err, fence.ErrNotFound) {
				t.Fatalf("UpdateVersion of a missing row = %v, want ErrNotFound", err)
			}
		})
	}
}

func TestTableUpdateVersion(t *testing.T) {
	for _, foundRows := range []bool{false, true} {
		t.Run(foundRowsName(foundRows), func(t *testing.T) {
			ctx, db, tbl := accounts(t, foundRows)
			// The same values again still bump the version.
			for want := int64(2); want <= 3; want++ {
				next, err := tbl.UpdateVersion(ctx, db, "k", want-1, mysql.Set("balance", 0))
				if err != nil || next != want {
					t.Fatalf("UpdateVersion = %d, %v; want %d", next, err, want)
				}
			}
			_, err := tbl.UpdateVersion(ctx, db, "k", 2, mysql.Set("balance", 5))
			var ce *fence.ConflictError
			if !errors.As(err, &ce) || ce.Expected != 2 || ce.Actual != 3 {
				t.Fatalf("stale UpdateVersion = %v, want a conflict expecting 2, finding 3", err)
			}
			if bal, ver := balance(t, ctx, db, tbl, "k"); bal != 0 || ver != 3 {
				t.Fatalf("balance, version = %d, %d; want 0, 3", bal, ver)
			}
			mustExec(t, ctx, db, `UPDATE `+q(hostileName)+` SET `+q(tbl.Version)+` = NULL`)
			if _, err := tbl.UpdateVersion(ctx, db, "k", 3); !errors.Is(err, mysql.ErrNullVersion) || errors.Is(err, fence.ErrConflict) {
				t.Fatalf("UpdateVersion on a NULL version = %v, want ErrNullVersion", err)
			}
		})
	}
}

// TestTableVersionLosesNothing runs concurrent read-modify-write increments
// with UpdateVersion and Retry: every one lands. The negative control does
// the same read-modify-write with a plain UPDATE and must lose some.
func TestTableVersionLosesNothing(t *testing.T) {
	const workers, each = 6, 15
	run := func(t *testing.T, versioned bool) int64 {
		ctx, db, tbl := accounts(t, false)
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range each {
					err := mysql.Retry(ctx, 1000, func(ctx context.Context) error {
						var bal, ver int64
						if err := db.QueryRowContext(ctx, `SELECT balance, `+q(tbl.Version)+` FROM `+q(hostileName)+` WHERE `+q(tbl.Key)+` = 'k'`).Scan(&bal, &ver); err != nil {
							return err
						}
						if versioned {
							_, err := tbl.UpdateVersion(ctx, db, "k", ver, mysql.Set("balance", bal+1))
							return err
						}
						_, err := db.ExecContext(ctx, `UPDATE `+q(hostileName)+` SET balance = ? WHERE `+q(tbl.Key)+` = 'k'`, bal+1)
						return err
					})
					if err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		bal, _ := balance(t, ctx, db, tbl, "k")
		return bal
	}
	if got := run(t, true); got != workers*each {
		t.Fatalf("versioned increments: balance %d, want %d", got, workers*each)
	}
	// Losses are random; a few runs make seeing one near certain.
	for range 5 {
		if got := run(t, false); got < workers*each {
			t.Logf("negative control: plain updates kept %d of %d increments", got, workers*each)
			return
		}
	}
	t.Fatal("no increment lost by plain read-modify-writes: the test cannot see a loss")
}

// TestTableInTransaction uses Update as the fenced read of a row inside a
// transaction: the row stays locked, so a second holder waits and then sees
// the first one's write.
func TestTableInTransaction(t *testing.T) {
	ctx, db, tbl := accounts(t, false)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := tbl.Update(ctx, tx, fenceOf("acct", 1, "a"), "k"); err != nil {
		t.Fatal(err)
	}
	// The same fence again, in the same transaction, changes nothing and is
	// admitted.
	if err := tbl.Update(ctx, tx, fenceOf("acct", 1, "a"), "k"); err != nil {
		t.Fatalf("repeated fenced read: %v", err)
	}
	if err := tbl.Update(ctx, tx, fenceOf("acct", 1, "a"), "k", mysql.Set("balance", 1)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	wantStale(t, tbl.Update(ctx, db, fenceOf("acct", 1, "b"), "k", mysql.Set("balance", 2)), fenceOf("acct", 1, "a"))
}

// TestTableHostileNamesAreNames shows that names holding backticks,
// quotes and SQL are only ever names.
func TestTableHostileNamesAreNames(t *testing.T) {
	ctx, db, tbl := accounts(t, false)
	if err := tbl.Update(ctx, db, fenceOf("acct", 1, "h"), "k", mysql.Set("balance", 3)); err != nil {
		t.Fatal(err)
	}
	other := mysql.Table{Name: "y`; DROP TABLE y; --", Key: "k"}
	err := other.Update(ctx, db, fenceOf("acct", 1, "h"), 1)
	if err == nil || errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("Update of a missing hostile table = %v, want the server's error", err)
	}
	if !strings.Contains(fmt.Sprint(err), "1146") {
		t.Fatalf("err = %v, want error 1146 (no such table)", err)
	}
}

// TestTableNamesWithPlaceholders runs Table calls on names holding question
// marks, backticks and comment starts with interpolateParams=true, where
// the driver itself puts the arguments into the statement: names must stay
// names and arguments must land where their placeholders are.
func TestTableNamesWithPlaceholders(t *testing.T) {
	cfg := testenv.MySQLConfig(t)
	cfg.InterpolateParams = true
	ctx, db := setupWith(t, cfg)
	tbl := mysql.Table{Name: "t?`-- ?", Key: "k?", Token: "tok`?", Holder: "h?", Version: "v?"}
	mustExec(t, ctx, db, `CREATE TABLE `+q(tbl.Name)+` (`+q(tbl.Key)+` INT PRIMARY KEY, `+q("b?")+` BIGINT NOT NULL DEFAULT 0, `+
		q(tbl.Token)+` BIGINT, `+q(tbl.Holder)+` VARBINARY(1024), `+q(tbl.Version)+` BIGINT NOT NULL DEFAULT 1)`)
	if err := tbl.Upsert(ctx, db, fenceOf("r", 2, "h'?"), 1, mysql.Set("b?", 5)); err != nil {
		t.Fatal(err)
	}
	wantStale(t, tbl.Update(ctx, db, fenceOf("r", 1, "h'?"), 1, mysql.Set("b?", 6)), fenceOf("r", 2, "h'?"))
	if _, err := tbl.UpdateVersion(ctx, db, 1, 1, mysql.Set("b?", 7)); err != nil {
		t.Fatal(err)
	}
	var b, v int64
	if err := db.QueryRowContext(ctx, `SELECT `+q("b?")+`, `+q(tbl.Version)+` FROM `+q(tbl.Name)+` WHERE `+q(tbl.Key)+` = 1`).Scan(&b, &v); err != nil || b != 7 || v != 2 {
		t.Fatalf("row = %d, version %d, %v; want 7, 2", b, v, err)
	}
}
