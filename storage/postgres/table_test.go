package postgres_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/storage/postgres"
)

const hostileName = `x"; DROP TABLE y; --`

// accounts creates a table named hostileName with hostile column names too,
// next to a table y that must survive every call.
func accounts(t *testing.T) (context.Context, *pgxpool.Pool, postgres.Table) {
	t.Helper()
	ctx, pool := setup(t)
	tbl := postgres.Table{
		Name:    pgx.Identifier{hostileName},
		Key:     `id"--`,
		Token:   `tok"; DROP TABLE y; --`,
		Holder:  "holder",
		Version: "ver sion",
	}
	q := func(s string) string { return pgx.Identifier{s}.Sanitize() }
	mustExec(t, ctx, pool, `CREATE TABLE y (v int)`)
	mustExec(t, ctx, pool, `CREATE TABLE `+q(hostileName)+` (`+q(tbl.Key)+` text PRIMARY KEY, balance bigint NOT NULL DEFAULT 0, `+
		q(tbl.Token)+` bigint, `+q(tbl.Holder)+` text, `+q(tbl.Version)+` bigint NOT NULL DEFAULT 1)`)
	mustExec(t, ctx, pool, `INSERT INTO `+q(hostileName)+` (`+q(tbl.Key)+`) VALUES ('k')`)
	t.Cleanup(func() {
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM y`).Scan(new(int)); err != nil {
			t.Errorf("table y did not survive: %v", err)
		}
	})
	return ctx, pool, tbl
}

func balance(t *testing.T, ctx context.Context, pool *pgxpool.Pool, tbl postgres.Table, key string) (bal, ver int64) {
	t.Helper()
	q := func(s string) string { return pgx.Identifier{s}.Sanitize() }
	err := pool.QueryRow(ctx, `SELECT balance, `+q(tbl.Version)+` FROM `+q(hostileName)+` WHERE `+q(tbl.Key)+` = $1`, key).Scan(&bal, &ver)
	if err != nil {
		t.Fatal(err)
	}
	return bal, ver
}

func TestTableUpdateAdmission(t *testing.T) {
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
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, pool, tbl := accounts(t)
			// A row without a mark admits any fence.
			if err := tbl.Update(ctx, pool, hwm, "k", postgres.Set("balance", 10)); err != nil {
				t.Fatal(err)
			}
			err := tbl.Update(ctx, pool, tt.f, "k", postgres.Set("balance", 20))
			want := int64(10)
			if tt.admit {
				if err != nil {
					t.Fatalf("Update = %v, want admitted", err)
				}
				want = 20
			} else {
				wantStale(t, err, hwm)
			}
			if bal, _ := balance(t, ctx, pool, tbl, "k"); bal != want {
				t.Fatalf("balance = %d, want %d", bal, want)
			}
			// Upsert on the existing row follows the same rule.
			err = tbl.Upsert(ctx, pool, tt.f, "k", postgres.Set("balance", 30))
			if tt.admit {
				if err != nil {
					t.Fatalf("Upsert = %v, want admitted", err)
				}
				want = 30
			} else {
				wantStale(t, err, hwm)
			}
			if bal, _ := balance(t, ctx, pool, tbl, "k"); bal != want {
				t.Fatalf("balance after upsert = %d, want %d", bal, want)
			}
			// The row's mark, read back as a stale error of a token-1 fence.
			err = tbl.Update(ctx, pool, fenceOf("acct", 1, "z"), "k")
			wantStale(t, err, tt.newMark)
		})
	}
}

func TestTableMissingRow(t *testing.T) {
	ctx, pool, tbl := accounts(t)
	err := tbl.Update(ctx, pool, fenceOf("acct", 1, "a"), "nope", postgres.Set("balance", 1))
	if !errors.Is(err, fence.ErrNotFound) || errors.Is(err, fence.ErrStale) {
		t.Fatalf("Update of a missing row = %v, want ErrNotFound", err)
	}
	if _, err := tbl.UpdateVersion(ctx, pool, "nope", 1, postgres.Set("balance", 1)); !errors.Is(err, fence.ErrNotFound) {
		t.Fatalf("UpdateVersion of a missing row = %v, want ErrNotFound", err)
	}
	// Upsert creates it, with its mark.
	if err := tbl.Upsert(ctx, pool, fenceOf("acct", 3, "a"), "new", postgres.Set("balance", 7)); err != nil {
		t.Fatal(err)
	}
	if bal, _ := balance(t, ctx, pool, tbl, "new"); bal != 7 {
		t.Fatalf("balance = %d, want 7", bal)
	}
	wantStale(t, tbl.Upsert(ctx, pool, fenceOf("acct", 2, "a"), "new", postgres.Set("balance", 8)), fenceOf("acct", 3, "a"))
}

func TestTableUpdateVersion(t *testing.T) {
	ctx, pool, tbl := accounts(t)
	v, err := tbl.UpdateVersion(ctx, pool, "k", 1, postgres.Set("balance", 5))
	if err != nil || v != 2 {
		t.Fatalf("UpdateVersion = %d, %v; want 2, nil", v, err)
	}
	// A write based on the old version conflicts and changes nothing.
	_, err = tbl.UpdateVersion(ctx, pool, "k", 1, postgres.Set("balance", 6))
	var ce *fence.ConflictError
	if !errors.As(err, &ce) || ce.Expected != 1 || ce.Actual != 2 {
		t.Fatalf("stale version: err = %v, want ConflictError expected 1 actual 2", err)
	}
	if bal, ver := balance(t, ctx, pool, tbl, "k"); bal != 5 || ver != 2 {
		t.Fatalf("balance %d version %d, want 5 and 2", bal, ver)
	}
}

// Concurrent read-modify-write loops on a version column lose nothing when
// retried with Retry; the same loop without the version check loses
// increments (the negative control).
func TestTableVersionRetryLosesNothing(t *testing.T) {
	ctx, pool, tbl := accounts(t)
	q := func(s string) string { return pgx.Identifier{s}.Sanitize() }
	read := `SELECT balance, ` + q(tbl.Version) + ` FROM ` + q(hostileName) + ` WHERE ` + q(tbl.Key) + ` = 'k'`
	const workers, rounds = 8, 10
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range rounds {
				err := postgres.Retry(ctx, 1000, func(ctx context.Context) error {
					var bal, ver int64
					if err := pool.QueryRow(ctx, read).Scan(&bal, &ver); err != nil {
						return err
					}
					_, err := tbl.UpdateVersion(ctx, pool, "k", ver, postgres.Set("balance", bal+1))
					return err
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if bal, _ := balance(t, ctx, pool, tbl, "k"); bal != workers*rounds {
		t.Fatalf("balance = %d, want %d", bal, workers*rounds)
	}

	// Negative control: two interleaved read-modify-writes without the
	// version check lose one increment.
	mustExec(t, ctx, pool, `UPDATE `+q(hostileName)+` SET balance = 0`)
	var b1, b2, v int64
	_ = pool.QueryRow(ctx, read).Scan(&b1, &v)
	_ = pool.QueryRow(ctx, read).Scan(&b2, &v)
	mustExec(t, ctx, pool, `UPDATE `+q(hostileName)+` SET balance = $1`, b1+1)
	mustExec(t, ctx, pool, `UPDATE `+q(hostileName)+` SET balance = $1`, b2+1)
	if bal, _ := balance(t, ctx, pool, tbl, "k"); bal != 1 {
		t.Fatalf("negative control: balance = %d after two unchecked increments, want the loss (1)", bal)
	}
	// With the version check, the second write of that interleaving conflicts.
	if _, err := tbl.UpdateVersion(ctx, pool, "k", v, postgres.Set("balance", b1+1)); err != nil {
		t.Fatal(err)
	}
	if _, err := tbl.UpdateVersion(ctx, pool, "k", v, postgres.Set("balance", b2+1)); !errors.Is(err, fence.ErrConflict) {
		t.Fatalf("second write on the same version = %v, want ErrConflict", err)
	}
}

func TestTableBadInput(t *testing.T) {
	ctx, pool, tbl := accounts(t)
	f := fenceOf("acct", 1, "a")
	cases := map[string]func() error{
		"empty name": func() error { return postgres.Table{Key: "id"}.Update(ctx, pool, f, "k") },
		"empty name part": func() error {
			return postgres.Table{Name: pgx.Identifier{"s", ""}, Key: "id"}.Update(ctx, pool, f, "k")
		},
		"empty key":    func() error { return postgres.Table{Name: pgx.Identifier{"t"}}.Upsert(ctx, pool, f, "k") },
		"empty column": func() error { return tbl.Update(ctx, pool, f, "k", postgres.Set("", 1)) },
		"column twice": func() error {
			return tbl.Update(ctx, pool, f, "k", postgres.Set("balance", 1), postgres.Set("balance", 2))
		},
		"token column set": func() error { return tbl.Update(ctx, pool, f, "k", postgres.Set(tbl.Token, 9)) },
		"version set": func() error {
			_, err := tbl.UpdateVersion(ctx, pool, "k", 1, postgres.Set(tbl.Version, 9))
			return err
		},
		"nil db": func() error { return tbl.Update(ctx, nil, f, "k") },
	}
	for name, call := range cases {
		if err := call(); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("%s: err = %v, want fence.ErrInvalid", name, err)
		}
	}
	if err := tbl.Update(ctx, pool, fence.Fence{Resource: "acct", Token: 0, Holder: "a"}, "k"); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("invalid fence: err = %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := tbl.Update(cctx, pool, f, "k", postgres.Set("balance", 1)); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: err = %v, want context.Canceled", err)
	}
	if bal, ver := balance(t, ctx, pool, tbl, "k"); bal != 0 || ver != 1 {
		t.Fatalf("bad input changed the row: balance %d version %d", bal, ver)
	}
}

// Table and column names are quoted, never spliced: a table named
// `x"; DROP TABLE y; --` is just a name, and table y survives every call.
func TestTableHostileNameIsAName(t *testing.T) {
	ctx, pool, tbl := accounts(t)
	f := fenceOf("acct", 1, "a")
	if err := tbl.Upsert(ctx, pool, f, `k2"; DROP TABLE y; --`, postgres.Set("balance", 3)); err != nil {
		t.Fatal(err)
	}
	if err := tbl.Update(ctx, pool, f, "k", postgres.Set("balance", 4)); err != nil {
		t.Fatal(err)
	}
	if _, err := tbl.UpdateVersion(ctx, pool, "k", 1, postgres.Set("balance", 5)); err != nil {
		t.Fatal(err)
	}
	if err := tbl.Update(ctx, pool, f, "missing"); !errors.Is(err, fence.ErrNotFound) {
		t.Fatal(err)
	}
	var tables int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = current_schema() AND tablename IN ('y', $1)`, hostileName).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 2 {
		t.Fatalf("%d of tables y and %q exist, want both", tables, hostileName)
	}
	if bal, ver := balance(t, ctx, pool, tbl, "k"); bal != 5 || ver != 2 {
		t.Fatalf("balance %d version %d, want 5 and 2", bal, ver)
	}
}

// A NULL version equals nothing a caller can pass: UpdateVersion says so
// with ErrNullVersion instead of failing to scan, and it is not a conflict
// that Retry would run again.
func TestTableUpdateVersionNullVersion(t *testing.T) {
	ctx, pool := setup(t)
	mustExec(t, ctx, pool, `CREATE TABLE doc (id text PRIMARY KEY, body text, version bigint)`)
	mustExec(t, ctx, pool, `INSERT INTO doc (id, body) VALUES ('d', 'old')`)
	tbl := postgres.Table{Name: pgx.Identifier{"doc"}, Key: "id"}
	calls := 0
	err := postgres.Retry(ctx, 3, func(ctx context.Context) error {
		calls++
		_, err := tbl.UpdateVersion(ctx, pool, "d", 1, postgres.Set("body", "new"))
		return err
	})
	if !errors.Is(err, postgres.ErrNullVersion) {
		t.Fatalf("err = %v, want ErrNullVersion", err)
	}
	if errors.Is(err, fence.ErrConflict) || calls != 1 {
		t.Fatalf("a NULL version was treated as a conflict (%d calls): %v", calls, err)
	}
	var body string
	if err := pool.QueryRow(ctx, `SELECT body FROM doc WHERE id = 'd'`).Scan(&body); err != nil {
		t.Fatal(err)
	}
	if body != "old" {
		t.Fatalf("body = %q, want the row unchanged", body)
	}
}
