package postgres_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/storage/postgres"
)

var errSent = errors.New("recorder: a statement was sent")

// recorder stands in for every handle this package takes and counts the
// statements it is asked to send, sending none. Methods it does not override
// belong to a nil pgx.Tx and panic, which the tests count as a send too.
type recorder struct {
	pgx.Tx
	sent atomic.Int32
}

func (r *recorder) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	r.sent.Add(1)
	return pgconn.CommandTag{}, errSent
}

func (r *recorder) Query(context.Context, string, ...any) (pgx.Rows, error) {
	r.sent.Add(1)
	return nil, errSent
}

func (r *recorder) QueryRow(context.Context, string, ...any) pgx.Row {
	r.sent.Add(1)
	return errRow{}
}

func (r *recorder) SendBatch(_ context.Context, b *pgx.Batch) pgx.BatchResults {
	r.sent.Add(1)
	return pgx.FailedBatchResults(b, errSent)
}

func (r *recorder) Begin(context.Context) (pgx.Tx, error) {
	r.sent.Add(1)
	return nil, errSent
}

func (r *recorder) BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error) {
	r.sent.Add(1)
	return nil, errSent
}

type errRow struct{}

func (errRow) Scan(...any) error { return errSent }

// refusedUnsent runs call against a recorder and fails t unless it returns an
// error matching want and sent nothing.
func refusedUnsent(t *testing.T, name string, want error, call func(db *recorder) error) {
	t.Helper()
	db := &recorder{}
	var err error
	if p := recovered(func() { err = call(db) }); p != nil {
		t.Errorf("%s: panicked with %v, want %v before anything is sent", name, p, want)
		return
	}
	if !errors.Is(err, want) {
		t.Errorf("%s: err = %v, want %v", name, err, want)
	}
	if n := db.sent.Load(); n != 0 {
		t.Errorf("%s: sent %d statements, want none", name, n)
	}
}

// tableCalls is every Table method, each called with a valid fence.
func tableCalls(tbl postgres.Table, values ...postgres.Assignment) map[string]func(ctx context.Context, db *recorder) error {
	f := fenceOf("acct", 1, "a")
	return map[string]func(ctx context.Context, db *recorder) error{
		"Update": func(ctx context.Context, db *recorder) error { return tbl.Update(ctx, db, f, "k", values...) },
		"Upsert": func(ctx context.Context, db *recorder) error { return tbl.Upsert(ctx, db, f, "k", values...) },
		"UpdateVersion": func(ctx context.Context, db *recorder) error {
			_, err := tbl.UpdateVersion(ctx, db, "k", 1, values...)
			return err
		},
	}
}

// Key, Token, Holder and Version must name four different columns, compared
// after defaults are applied, or Update writes the token into the key and
// UpdateVersion increments it.
func TestTableRefusesOverlappingColumns(t *testing.T) {
	name := pgx.Identifier{"acct"}
	tables := map[string]postgres.Table{
		"key is token":              {Name: name, Key: "c", Token: "c"},
		"key is holder":             {Name: name, Key: "c", Holder: "c"},
		"key is version":            {Name: name, Key: "c", Version: "c"},
		"token is holder":           {Name: name, Key: "id", Token: "c", Holder: "c"},
		"token is version":          {Name: name, Key: "id", Token: "c", Version: "c"},
		"holder is version":         {Name: name, Key: "id", Holder: "c", Version: "c"},
		"key is default token":      {Name: name, Key: postgres.DefaultTokenColumn},
		"key is default holder":     {Name: name, Key: postgres.DefaultHolderColumn},
		"key is default version":    {Name: name, Key: postgres.DefaultVersionColumn},
		"token is default holder":   {Name: name, Key: "id", Token: postgres.DefaultHolderColumn},
		"token is default version":  {Name: name, Key: "id", Token: postgres.DefaultVersionColumn},
		"holder is default version": {Name: name, Key: "id", Holder: postgres.DefaultVersionColumn},
		"version is default token":  {Name: name, Key: "id", Version: postgres.DefaultTokenColumn},
		"all four the same":         {Name: name, Key: "c", Token: "c", Holder: "c", Version: "c"},
	}
	for tname, tbl := range tables {
		for mname, call := range tableCalls(tbl) {
			refusedUnsent(t, tname+": "+mname, fence.ErrInvalid,
				func(db *recorder) error { return call(context.Background(), db) })
		}
	}
}

// A value may not name the key, token, holder or version column: every
// method refuses all four, so no call can overwrite what another one manages.
func TestTableRefusesValueOnManagedColumn(t *testing.T) {
	tbl := postgres.Table{Name: pgx.Identifier{"acct"}, Key: "id", Token: "tok", Holder: "who", Version: "ver"}
	for _, col := range []string{"id", "tok", "who", "ver"} {
		for mname, call := range tableCalls(tbl, postgres.Set(col, 1)) {
			refusedUnsent(t, mname+" setting "+col, fence.ErrInvalid,
				func(db *recorder) error { return call(context.Background(), db) })
		}
	}
}

// pgx.Identifier.Sanitize drops NUL bytes, so "a\x00b" would quote as "ab":
// a name with a NUL is refused rather than silently made another name.
func TestTableRefusesNULInNames(t *testing.T) {
	const nul = "a\x00b"
	tables := map[string]postgres.Table{
		"table":   {Name: pgx.Identifier{nul}, Key: "id"},
		"schema":  {Name: pgx.Identifier{nul, "acct"}, Key: "id"},
		"key":     {Name: pgx.Identifier{"acct"}, Key: nul},
		"token":   {Name: pgx.Identifier{"acct"}, Key: "id", Token: nul},
		"holder":  {Name: pgx.Identifier{"acct"}, Key: "id", Holder: nul},
		"version": {Name: pgx.Identifier{"acct"}, Key: "id", Version: nul},
	}
	for tname, tbl := range tables {
		for mname, call := range tableCalls(tbl) {
			refusedUnsent(t, "NUL in "+tname+": "+mname, fence.ErrInvalid,
				func(db *recorder) error { return call(context.Background(), db) })
		}
	}
	tbl := postgres.Table{Name: pgx.Identifier{"acct"}, Key: "id"}
	for mname, call := range tableCalls(tbl, postgres.Set(nul, 1)) {
		refusedUnsent(t, "NUL in value column: "+mname, fence.ErrInvalid,
			func(db *recorder) error { return call(context.Background(), db) })
	}
	// "ab" itself, without a NUL, is a fine name.
	ctx, pool := setup(t)
	mustExec(t, ctx, pool, `CREATE TABLE ab (id text PRIMARY KEY, ab bigint, fence_token bigint, fence_holder text)`)
	if err := (postgres.Table{Name: pgx.Identifier{"ab"}, Key: "id"}).Upsert(ctx, pool, fenceOf("r", 1, "a"), "k", postgres.Set("ab", 1)); err != nil {
		t.Fatal(err)
	}
}

// Every exported call refuses a nil context with fence.ErrInvalid and
// sends nothing.
func TestNilContextRefused(t *testing.T) {
	var nilCtx context.Context
	f := fenceOf("r", 1, "a")
	stmt := postgres.Statement{SQL: `SELECT 1`}
	calls := map[string]func(db *recorder) error{
		"Guard":    func(db *recorder) error { return postgres.Guard(nilCtx, db, f) },
		"GuardAll": func(db *recorder) error { return postgres.GuardAll(nilCtx, db, f) },
		"HighWater": func(db *recorder) error {
			_, err := postgres.HighWater(nilCtx, db, "r")
			return err
		},
		"InTx": func(db *recorder) error {
			return postgres.InTx(nilCtx, db, pgx.TxOptions{}, f, func(context.Context, pgx.Tx) error { return nil })
		},
		"Exec": func(db *recorder) error {
			_, err := postgres.Exec(nilCtx, db, f, stmt)
			return err
		},
		"Query": func(db *recorder) error {
			return postgres.Query(nilCtx, db, f, stmt, func(pgx.Rows) error { return nil })
		},
		"Retry": func(*recorder) error {
			return postgres.Retry(nilCtx, 1, func(context.Context) error { return errSent })
		},
	}
	for mname, call := range tableCalls(postgres.Table{Name: pgx.Identifier{"acct"}, Key: "id"}) {
		calls["Table."+mname] = func(db *recorder) error { return call(nilCtx, db) }
	}
	for name, call := range calls {
		refusedUnsent(t, name, fence.ErrInvalid, call)
	}
}

// entryPoints calls every function that takes a resource with one named r.
func entryPoints(r string) map[string]func(ctx context.Context, db *recorder) error {
	f := fenceOf(r, 1, "a")
	stmt := postgres.Statement{SQL: `SELECT 1`}
	calls := map[string]func(ctx context.Context, db *recorder) error{
		"Guard": func(ctx context.Context, db *recorder) error { return postgres.Guard(ctx, db, f) },
		"GuardAll": func(ctx context.Context, db *recorder) error {
			return postgres.GuardAll(ctx, db, fenceOf("a", 1, "a"), f)
		},
		"InTx": func(ctx context.Context, db *recorder) error {
			return postgres.InTx(ctx, db, pgx.TxOptions{}, f, func(context.Context, pgx.Tx) error { return nil })
		},
		"Exec": func(ctx context.Context, db *recorder) error {
			_, err := postgres.Exec(ctx, db, f, stmt)
			return err
		},
		"Query": func(ctx context.Context, db *recorder) error {
			return postgres.Query(ctx, db, f, stmt, func(pgx.Rows) error { return nil })
		},
		"Table.Update": func(ctx context.Context, db *recorder) error {
			return postgres.Table{Name: pgx.Identifier{"acct"}, Key: "id"}.Update(ctx, db, f, "k")
		},
		"Table.Upsert": func(ctx context.Context, db *recorder) error {
			return postgres.Table{Name: pgx.Identifier{"acct"}, Key: "id"}.Upsert(ctx, db, f, "k")
		},
	}
	return calls
}

// A resource longer than fence.MaxResourceLen is refused by every entry
// point before anything is sent; one of exactly that length works against
// the guard table, whose primary key index must hold it.
func TestResourceLengthLimit(t *testing.T) {
	long := strings.Repeat("r", fence.MaxResourceLen+1)
	for name, call := range entryPoints(long) {
		refusedUnsent(t, name, fence.ErrInvalid, func(db *recorder) error { return call(context.Background(), db) })
	}
	refusedUnsent(t, "HighWater", fence.ErrInvalid, func(db *recorder) error {
		_, err := postgres.HighWater(context.Background(), db, long)
		return err
	})

	ctx, pool := setup(t)
	// Multi-byte characters: the limit is in bytes, and so is the index's.
	limit := strings.Repeat("é", fence.MaxResourceLen/2)
	if len(limit) != fence.MaxResourceLen {
		t.Fatalf("resource of %d bytes, want %d", len(limit), fence.MaxResourceLen)
	}
	f := fenceOf(limit, 1, strings.Repeat("h", 64))
	if err := postgres.InTx(ctx, pool, pgx.TxOptions{}, f, func(context.Context, pgx.Tx) error { return nil }); err != nil {
		t.Fatalf("InTx with a %d-byte resource: %v", len(limit), err)
	}
	if got := mark(t, ctx, pool, limit); got != f {
		t.Fatalf("mark = %v, want %v", got, f)
	}
	f.Token = 2
	if _, err := postgres.Exec(ctx, pool, f, postgres.Statement{SQL: `UPDATE counter SET n = n + 1 WHERE id = 1`}); err != nil {
		t.Fatalf("Exec with a %d-byte resource: %v", len(limit), err)
	}
	f.Token = 3
	if err := postgres.Query(ctx, pool, f, postgres.Statement{SQL: `SELECT 1`}, func(pgx.Rows) error { return nil }); err != nil {
		t.Fatalf("Query with a %d-byte resource: %v", len(limit), err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	f.Token = 4
	if err := postgres.GuardAll(ctx, tx, f, fenceOf(strings.Repeat("s", fence.MaxResourceLen), 1, "h")); err != nil {
		t.Fatalf("GuardAll with %d-byte resources: %v", len(limit), err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := mark(t, ctx, pool, limit); got != f {
		t.Fatalf("mark = %v, want %v", got, f)
	}
	stale := fenceOf(limit, 1, "old")
	_, err = postgres.Exec(ctx, pool, stale)
	wantStale(t, err, f)
	if n, _ := counter(t, ctx, pool); n != 1 {
		t.Fatalf("n = %d, want the one admitted Exec", n)
	}
}

// HighWater applies fence.Validate's resource rule before sending anything:
// a resource no fence could carry has no mark to read, and PostgreSQL's text
// type would refuse it with a server error (22021) after a round trip.
func TestHighWaterRefusesResourcesNoFenceCarries(t *testing.T) {
	for _, r := range []string{"", "a\x00b", "\xff\xfe", strings.Repeat("r", fence.MaxResourceLen+1)} {
		for _, want := range []error{fence.ErrInvalid, fence.ErrInvalid} {
			refusedUnsent(t, "HighWater "+strconv.Quote(r[:min(len(r), 8)]), want, func(db *recorder) error {
				_, err := postgres.HighWater(context.Background(), db, r)
				return err
			})
		}
	}
}

// The package's own invalid-argument sentinel is the module's: errors.Is
// against fence.ErrInvalid works whichever package refused the call.
func TestInvalidArgumentMatchesFenceErrInvalid(t *testing.T) {
	refusedUnsent(t, "Exec with a nil handle", fence.ErrInvalid, func(*recorder) error {
		_, err := postgres.Exec(context.Background(), nil, fenceOf("r", 1, "a"))
		return err
	})
}
