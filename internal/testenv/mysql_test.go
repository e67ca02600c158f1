package testenv

import (
	"context"
	"database/sql"
	"testing"
)

// TestMySQLDatabasePerTest checks that MySQL gives a test a database of its
// own, current on every connection, and drops it when the test ends.
func TestMySQLDatabasePerTest(t *testing.T) {
	ctx := context.Background()
	var name string
	t.Run("inner", func(t *testing.T) {
		db := MySQL(t)
		db.SetMaxOpenConns(3)
		for range 3 {
			var got string
			if err := db.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&got); err != nil {
				t.Fatal(err)
			}
			if name != "" && got != name {
				t.Fatalf("connections use %q and %q", name, got)
			}
			name = got
		}
		if _, err := db.ExecContext(ctx, "CREATE TABLE t (id INT PRIMARY KEY)"); err != nil {
			t.Fatal(err)
		}
	})
	admin, err := sql.Open("mysql", MySQLBaseDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	var n int
	if err := admin.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?", name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if name == "" || n != 0 {
		t.Fatalf("database %q still exists after its test (%d)", name, n)
	}
}
