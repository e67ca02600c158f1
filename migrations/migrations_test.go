package migrations_test

import (
	"context"
	"database/sql"
	"errors"
	"io/fs"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/migrations"
)

func openDB(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// versions returns how many times each migration version was recorded as
// applied in the schema the test owns.
func versions(t *testing.T, ctx context.Context, db *sql.DB) map[int64]int {
	t.Helper()
	rows, err := db.QueryContext(ctx, "SELECT version_id FROM "+migrations.VersionTable+" WHERE is_applied")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[int64]int{}
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		got[v]++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return got
}

func wantVersions(t *testing.T) []int64 {
	t.Helper()
	names, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	if len(names) < 2 {
		t.Fatalf("FS holds %d SQL files at its root, want at least 2: %v", len(names), names)
	}
	// Versions are the files' numbers, which may leave gaps (a number
	// kept for a migration that lands separately).
	var vs []int64
	for _, name := range names {
		num, _, _ := strings.Cut(name, "_")
		v, err := strconv.ParseInt(num, 10, 64)
		if err != nil {
			t.Fatalf("migration %s has no version number: %v", name, err)
		}
		vs = append(vs, v)
	}
	return vs
}

func checkAppliedOnce(t *testing.T, ctx context.Context, db *sql.DB) {
	t.Helper()
	got := versions(t, ctx, db)
	for _, v := range wantVersions(t) {
		if got[v] != 1 {
			t.Errorf("version %d applied %d times, want once (all: %v)", v, got[v], got)
		}
	}
}

func TestUpTwiceIsNoOp(t *testing.T) {
	ctx := testCtx(t)
	db := openDB(t)
	if err := migrations.Up(ctx, db); err != nil {
		t.Fatalf("first Up: %v", err)
	}
	// A mark written between the runs must survive the second one: the
	// second Up must neither recreate the table nor touch its rows.
	if _, err := db.ExecContext(ctx, "INSERT INTO fencekit_guard (resource, token, holder) VALUES ('r', 7, 'h')"); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Up(ctx, db); err != nil {
		t.Fatalf("second Up: %v", err)
	}
	checkAppliedOnce(t, ctx, db)
	var token int64
	if err := db.QueryRowContext(ctx, "SELECT token FROM fencekit_guard WHERE resource = 'r'").Scan(&token); err != nil {
		t.Fatalf("mark lost by second Up: %v", err)
	}
	if token != 7 {
		t.Fatalf("token = %d after second Up, want 7", token)
	}
}

func TestUpConcurrent(t *testing.T) {
	ctx := testCtx(t)
	db := openDB(t)
	// Two pools on the same schema behave like two processes starting at once.
	db2, err := sql.Open("pgx", dsnOf(t, ctx, db))
	if err != nil {
		t.Fatal(err)
	}
	defer db2.Close()

	start := make(chan struct{})
	errs := make(chan error, 2)
	for _, d := range []*sql.DB{db, db2} {
		go func() {
			<-start
			errs <- migrations.Up(ctx, d)
		}()
	}
	close(start)
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("concurrent Up: %v", err)
		}
	}
	checkAppliedOnce(t, ctx, db)
}

// dsnOf returns a URL for the same database and schema as db.
func dsnOf(t *testing.T, ctx context.Context, db *sql.DB) string {
	t.Helper()
	var schema string
	if err := db.QueryRowContext(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(testenv.PostgresBaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

func TestUpSchemaIsUsable(t *testing.T) {
	ctx := testCtx(t)
	db := openDB(t)
	if err := migrations.Up(ctx, db); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "SELECT fencekit_guard_admit('r', 2, 'a')"); err != nil {
		t.Fatalf("admit on empty table: %v", err)
	}
	_, err := db.ExecContext(ctx, "SELECT fencekit_guard_admit('r', 1, 'b')")
	if err == nil || !containsCode(err, "FK001") {
		t.Fatalf("stale admit = %v, want SQLSTATE FK001", err)
	}
	// One completion record per key, whatever the resource.
	const record = "INSERT INTO fencekit_once (key, resource, token, holder) VALUES ('k', $1, 1, 'h')"
	if _, err := db.ExecContext(ctx, record, "r"); err != nil {
		t.Fatalf("first completion record: %v", err)
	}
	if _, err := db.ExecContext(ctx, record, "s"); err == nil || !containsCode(err, "23505") {
		t.Fatalf("second record for the key = %v, want SQLSTATE 23505", err)
	}
}

func containsCode(err error, code string) bool {
	var coded interface{ SQLState() string }
	return errors.As(err, &coded) && coded.SQLState() == code
}

func TestUpBadInput(t *testing.T) {
	if err := migrations.Up(context.Background(), nil); err == nil {
		t.Fatal("Up(nil) succeeded")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	db := openDB(t)
	if err := migrations.Up(ctx, db); !errors.Is(err, context.Canceled) {
		t.Fatalf("Up with cancelled ctx = %v, want context.Canceled", err)
	}
	var n int
	if err := db.QueryRowContext(context.Background(),
		"SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("cancelled Up created %d tables", n)
	}
}

// A team running goose itself can use FS as it is: applying with a plain
// goose Provider and the same version table, then Up, applies nothing twice;
// the Down sections undo everything.
func TestPlainGooseUsesTheSameFiles(t *testing.T) {
	ctx := testCtx(t)
	db := openDB(t)
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS,
		goose.WithTableName(migrations.VersionTable), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		t.Fatal(err)
	}
	res, err := p.Up(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != len(wantVersions(t)) {
		t.Fatalf("goose applied %d migrations, want %d", len(res), len(wantVersions(t)))
	}
	if err := migrations.Up(ctx, db); err != nil {
		t.Fatal(err)
	}
	checkAppliedOnce(t, ctx, db)
	if _, err := p.DownTo(ctx, 0); err != nil {
		t.Fatalf("down: %v", err)
	}
	var n int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema() AND tablename = 'fencekit_guard'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatal("fencekit_guard survived goose down")
	}
	if err := migrations.Up(ctx, db); err != nil {
		t.Fatalf("Up after down: %v", err)
	}
}

// A database migrated before a migration was added gets only that one from
// the next Up, and keeps its marks.
func TestUpAppliesOnlyWhatIsMissing(t *testing.T) {
	ctx := testCtx(t)
	db := openDB(t)
	names, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	older := fstest.MapFS{}
	for _, name := range names[:len(names)-1] {
		b, err := fs.ReadFile(migrations.FS, name)
		if err != nil {
			t.Fatal(err)
		}
		older[name] = &fstest.MapFile{Data: b}
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, older,
		goose.WithTableName(migrations.VersionTable), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "INSERT INTO fencekit_guard (resource, token, holder) VALUES ('r', 7, 'h')"); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Up(ctx, db); err != nil {
		t.Fatal(err)
	}
	checkAppliedOnce(t, ctx, db)
	var token int64
	if err := db.QueryRowContext(ctx, "SELECT token FROM fencekit_guard WHERE resource = 'r'").Scan(&token); err != nil || token != 7 {
		t.Fatalf("mark after Up = %d, %v; want 7", token, err)
	}
}
