package migrations_test

import (
	"database/sql"
	"database/sql/driver"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/migrations"
)

// TestUpMySQLOnPostgresPointsToUp: the MySQL migrations run on a
// PostgreSQL database fail with a message that says which call to use, and
// create nothing; as Up does on MySQL. Behind a driver wrapper too, where
// the server is asked once the migrations failed.
func TestUpMySQLOnPostgresPointsToUp(t *testing.T) {
	ctx := testCtx(t)
	u := testenv.PostgresURL(t)
	db, err := sql.Open("pgx", u)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = migrations.UpMySQL(ctx, db)
	const want = "migrations: UpMySQL applies fencekit's MySQL migrations, but db is a PostgreSQL database: call migrations.Up(ctx, db) instead"
	if err == nil || err.Error() != want {
		t.Fatalf("UpMySQL on PostgreSQL:\n got %v\nwant %s", err, want)
	}
	wrapped := sql.OpenDB(wrappedConnector{pgxConnector(t, u)})
	defer wrapped.Close()
	err = migrations.UpMySQL(ctx, wrapped)
	if err == nil || !strings.HasPrefix(err.Error(), "migrations: UpMySQL applies fencekit's MySQL migrations, but db is a PostgreSQL database (PostgreSQL ") ||
		!strings.Contains(err.Error(), "call migrations.Up(ctx, db) instead") {
		t.Fatalf("UpMySQL on a wrapped PostgreSQL driver = %v", err)
	}
	var n int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()").Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d tables created (%v), want none", n, err)
	}
}

// pgxConnector is a connector of pgx's driver on u, for a wrapper to hide.
func pgxConnector(t *testing.T, u string) driver.Connector {
	t.Helper()
	c, err := stdlib.GetDefaultDriver().(driver.DriverContext).OpenConnector(u)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
