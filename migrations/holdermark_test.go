package migrations_test

import (
	"context"
	"database/sql"
	"io/fs"
	"testing"
	"testing/fstest"

	"github.com/pressly/goose/v3"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/migrations"
)

// holderMarkVersion is the migration that turns fencekit_once's holder ids
// into their marks, in both FS and MySQLFS.
const holderMarkVersion = 4

// oldHolders are holder ids as records written before holderMarkVersion
// keep them, each with the record's key: a lock's id, ASCII and not, and a
// mark, which the migration leaves as it is.
var oldHolders = map[string]string{
	"k1": "b6f1c0de3a0f4e9c8d7b6a5f4e3d2c1b",
	"k2": "holder with spaces and ünïcödé ✓",
	"k3": "#0badf00d",
}

// before returns the migrations of fsys older than holderMarkVersion.
func before(t *testing.T, fsys fs.FS) fs.FS {
	t.Helper()
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil || len(names) < holderMarkVersion {
		t.Fatalf("migrations %v (%v): want at least %d", names, err, holderMarkVersion)
	}
	older := fstest.MapFS{}
	for _, name := range names[:holderMarkVersion-1] {
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			t.Fatal(err)
		}
		older[name] = &fstest.MapFile{Data: b}
	}
	return older
}

// wantMarks checks that every record of oldHolders now holds the holder's
// mark, as fence.HolderMark computes it (a mark stays as it was).
func wantMarks(t *testing.T, ctx context.Context, db *sql.DB, query string) {
	t.Helper()
	for key, holder := range oldHolders {
		want := fence.HolderMark(holder)
		if holder[0] == '#' {
			want = holder
		}
		var got string
		if err := db.QueryRowContext(ctx, query, key).Scan(&got); err != nil {
			t.Fatalf("record %s: %v", key, err)
		}
		if got != want {
			t.Errorf("record %s: holder %q after the migration, want %q (fence.HolderMark of %q)", key, got, want, holder)
		}
	}
}

// TestUpTurnsOnceHoldersIntoMarks: records that fencekit_once kept with the
// holder id before migration 00004 hold the holder's mark after Up, equal to
// fence.HolderMark of the id.
func TestUpTurnsOnceHoldersIntoMarks(t *testing.T) {
	ctx := testCtx(t)
	db := openDB(t)
	p, err := goose.NewProvider(goose.DialectPostgres, db, before(t, migrations.FS),
		goose.WithTableName(migrations.VersionTable), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatal(err)
	}
	for key, holder := range oldHolders {
		if _, err := db.ExecContext(ctx, "INSERT INTO fencekit_once (key, resource, token, holder) VALUES ($1, 'r', 1, $2)", key, holder); err != nil {
			t.Fatal(err)
		}
	}
	if err := migrations.Up(ctx, db); err != nil {
		t.Fatal(err)
	}
	checkAppliedOnce(t, ctx, db)
	wantMarks(t, ctx, db, "SELECT holder FROM fencekit_once WHERE key = $1")
}

// TestUpMySQLTurnsOnceHoldersIntoMarks is TestUpTurnsOnceHoldersIntoMarks
// for MySQLFS and UpMySQL.
func TestUpMySQLTurnsOnceHoldersIntoMarks(t *testing.T) {
	ctx := testCtx(t)
	db := testenv.MySQL(t)
	p, err := goose.NewProvider(goose.DialectMySQL, db, before(t, migrations.MySQLFS),
		goose.WithTableName(migrations.VersionTable), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatal(err)
	}
	for key, holder := range oldHolders {
		if _, err := db.ExecContext(ctx, "INSERT INTO fencekit_once (`key`, resource, token, holder, done_at) VALUES (?, 'r', 1, ?, UTC_TIMESTAMP(6))", key, holder); err != nil {
			t.Fatal(err)
		}
	}
	if err := migrations.UpMySQL(ctx, db); err != nil {
		t.Fatal(err)
	}
	checkMySQLAppliedOnce(t, ctx, db)
	wantMarks(t, ctx, db, "SELECT holder FROM fencekit_once WHERE `key` = ?")
}
