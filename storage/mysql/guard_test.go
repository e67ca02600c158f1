package mysql_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/storage/mysql"
)

func TestGuardAdmission(t *testing.T) {
	hwm := fenceOf("r", 5, "a")
	tests := []struct {
		name    string
		f       fence.Fence
		admit   bool
		newMark fence.Fence
	}{
		{"lower token is stale", fenceOf("r", 4, "a"), false, hwm},
		{"equal token same holder is admitted", fenceOf("r", 5, "a"), true, hwm},
		{"equal token other holder is stale", fenceOf("r", 5, "b"), false, hwm},
		{"higher token is admitted and raises the mark", fenceOf("r", 6, "b"), true, fenceOf("r", 6, "b")},
	}
	// Admission must not depend on the driver's found-rows flag, which
	// changes the affected-row counts the guard sees.
	for _, foundRows := range []bool{false, true} {
		for _, tt := range tests {
			t.Run(foundRowsName(foundRows)+"/"+tt.name, func(t *testing.T) {
				cfg := testenv.MySQLConfig(t)
				cfg.ClientFoundRows = foundRows
				ctx, db := setupWith(t, cfg)
				raise(t, ctx, db, hwm)

				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback()
				err = mysql.Guard(ctx, tx, tt.f)
				if tt.admit {
					if err != nil {
						t.Fatalf("Guard(%v) = %v, want admitted", tt.f, err)
					}
					mustExec(t, ctx, tx, `UPDATE counter SET n = 42 WHERE id = 1`)
					if err := tx.Commit(); err != nil {
						t.Fatal(err)
					}
					if n, _ := counter(t, ctx, db); n != 42 {
						t.Fatalf("n = %d after admitted write, want 42", n)
					}
				} else {
					wantStale(t, err, hwm)
					var se *fence.StaleError
					if !errors.As(err, &se) || se.Fence != tt.f {
						t.Fatalf("StaleError.Fence = %+v, want %v", se, tt.f)
					}
					if err := tx.Rollback(); err != nil {
						t.Fatal(err)
					}
					ran := false
					err = mysql.InTx(ctx, db, nil, tt.f, func(ctx context.Context, tx *sql.Tx) error {
						ran = true
						_, err := tx.ExecContext(ctx, `UPDATE counter SET n = 99 WHERE id = 1`)
						return err
					})
					wantStale(t, err, hwm)
					if ran {
						t.Fatal("InTx ran fn for a stale fence")
					}
					if n, _ := counter(t, ctx, db); n != 0 {
						t.Fatalf("n = %d after stale guard, want 0 (nothing committed)", n)
					}
				}
				if got := mark(t, ctx, db, "r"); got != tt.newMark {
					t.Fatalf("mark = %v, want %v", got, tt.newMark)
				}
			})
		}
	}
}

func foundRowsName(on bool) string {
	if on {
		return "clientFoundRows=true"
	}
	return "clientFoundRows=false"
}

// TestGuardFirstAdmissionAndRepeat covers the affected-row counts the guard
// reads: a new row, the same fence again (which raises nothing), and a
// refusal, under both found-rows settings.
func TestGuardFirstAdmissionAndRepeat(t *testing.T) {
	for _, foundRows := range []bool{false, true} {
		t.Run(foundRowsName(foundRows), func(t *testing.T) {
			cfg := testenv.MySQLConfig(t)
			cfg.ClientFoundRows = foundRows
			ctx, db := setupWith(t, cfg)
			f := fenceOf("job", 7, "h1")
			for i := range 3 {
				if err := mysql.InTx(ctx, db, nil, f, func(context.Context, *sql.Tx) error { return nil }); err != nil {
					t.Fatalf("admission %d of the same fence: %v", i+1, err)
				}
			}
			if got := mark(t, ctx, db, "job"); got != f {
				t.Fatalf("mark = %v, want %v", got, f)
			}
			err := mysql.InTx(ctx, db, nil, fenceOf("job", 7, "h2"), func(context.Context, *sql.Tx) error { return nil })
			wantStale(t, err, f)
			// A new resource's first fence inserts its row.
			g := fenceOf("other", 1, "h3")
			raise(t, ctx, db, g)
			if got := mark(t, ctx, db, "other"); got != g {
				t.Fatalf("mark = %v, want %v", got, g)
			}
		})
	}
}

// TestGuardResourcesAreBytes shows that resources compare byte for byte:
// case and trailing spaces make different resources, which MySQL's and
// MariaDB's default collations (and utf8mb4_bin's padding) would merge.
func TestGuardResourcesAreBytes(t *testing.T) {
	ctx, db := setup(t)
	names := []string{"A", "a", "a ", "ä", "a\u0308", "\U0001F600"}
	for i, r := range names {
		raise(t, ctx, db, fenceOf(r, int64(10+i), "h"))
	}
	for i, r := range names {
		if got, want := mark(t, ctx, db, r), fenceOf(r, int64(10+i), "h"); got != want {
			t.Errorf("mark of %q = %v, want %v: resources were merged", r, got, want)
		}
	}
	// A low token on "A" is refused by "A"'s own mark only.
	err := mysql.InTx(ctx, db, nil, fenceOf("A", 9, "h"), func(context.Context, *sql.Tx) error { return nil })
	wantStale(t, err, fenceOf("A", 10, "h"))
}

// TestGuardLimits admits the longest resource and holder and the largest
// token the schema takes, and refuses longer ones before sending anything.
func TestGuardLimits(t *testing.T) {
	ctx, db := setup(t)
	longest := []string{
		strings.Repeat("r", fence.MaxResourceLen),
		strings.Repeat("\U0001F600", fence.MaxResourceLen/4), // 4-byte characters
	}
	for _, r := range longest {
		f := fence.Fence{Resource: r, Token: 1<<63 - 1, Holder: strings.Repeat("h", mysql.MaxHolderLen)}
		raise(t, ctx, db, f)
		if got := mark(t, ctx, db, r); got != f {
			t.Fatalf("mark of a %d-byte resource = %v, want %v", len(r), got, f)
		}
	}
	// A BIGINT token above 2^53 is kept exactly.
	f := fenceOf("big", 1<<53+1, "h")
	raise(t, ctx, db, f)
	wantStale(t, mysql.InTx(ctx, db, nil, fenceOf("big", 1<<53, "h"), func(context.Context, *sql.Tx) error { return nil }), f)

	tooLong := []fence.Fence{
		{Resource: strings.Repeat("r", fence.MaxResourceLen+1), Token: 1, Holder: "h"},
		{Resource: "r", Token: 1, Holder: strings.Repeat("h", mysql.MaxHolderLen+1)},
	}
	for _, f := range tooLong {
		err := mysql.InTx(ctx, db, nil, f, func(context.Context, *sql.Tx) error { return nil })
		if !errors.Is(err, fence.ErrInvalid) {
			t.Fatalf("InTx with a %d-byte resource and %d-byte holder = %v, want ErrInvalid", len(f.Resource), len(f.Holder), err)
		}
	}
}

func TestGuardNotMigrated(t *testing.T) {
	ctx := context.Background()
	db := testenv.MySQL(t) // no migrations
	err := mysql.InTx(ctx, db, nil, fenceOf("r", 1, "h"), func(context.Context, *sql.Tx) error { return nil })
	if !errors.Is(err, mysql.ErrNotMigrated) {
		t.Fatalf("InTx without migrations = %v, want ErrNotMigrated", err)
	}
	if _, err := mysql.HighWater(ctx, db, "r"); !errors.Is(err, mysql.ErrNotMigrated) {
		t.Fatalf("HighWater without migrations = %v, want ErrNotMigrated", err)
	}
}

// TestGuardSimultaneousAssignment runs the admission table on MariaDB with
// sql_mode SIMULTANEOUS_ASSIGNMENT, under which the guard's assignments all
// see the old row instead of the columns assigned before them.
func TestGuardSimultaneousAssignment(t *testing.T) {
	cfg := testenv.MySQLConfig(t)
	ctx, db := setupWith(t, cfg)
	var version string
	if err := db.QueryRowContext(ctx, `SELECT VERSION()`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(version, "MariaDB") {
		t.Skipf("SIMULTANEOUS_ASSIGNMENT is MariaDB's; server is %s", version)
	}
	cfg.Params = map[string]string{"sql_mode": "'STRICT_TRANS_TABLES,SIMULTANEOUS_ASSIGNMENT'"}
	db = testenv.OpenMySQL(t, cfg)
	var mode string
	if err := db.QueryRowContext(ctx, `SELECT @@SESSION.sql_mode`).Scan(&mode); err != nil || !strings.Contains(mode, "SIMULTANEOUS_ASSIGNMENT") {
		t.Fatalf("sql_mode = %q, %v", mode, err)
	}
	hwm := fenceOf("r", 5, "a")
	raise(t, ctx, db, hwm)
	for _, f := range []fence.Fence{fenceOf("r", 4, "a"), fenceOf("r", 5, "b")} {
		wantStale(t, mysql.InTx(ctx, db, nil, f, func(context.Context, *sql.Tx) error { return nil }), hwm)
	}
	raise(t, ctx, db, hwm)
	next := fenceOf("r", 6, "b")
	raise(t, ctx, db, next)
	if got := mark(t, ctx, db, "r"); got != next {
		t.Fatalf("mark = %v, want %v", got, next)
	}
}
