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

// TestPrivateMySQLKeepsCommittedData kills a private MariaDB with SIGKILL
// and restarts it: what was committed is still there.
func TestPrivateMySQLKeepsCommittedData(t *testing.T) {
	t.Parallel()
	s := StartMySQL(t)
	db := OpenMySQL(t, s.Config())
	if _, err := db.Exec("CREATE TABLE t (id INT PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("INSERT INTO t VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	s.Restart()
	var n int
	err := db.QueryRow("SELECT COUNT(*) FROM t").Scan(&n)
	if err != nil {
		// The pool's old connection died with the server.
		err = db.QueryRow("SELECT COUNT(*) FROM t").Scan(&n)
	}
	if err != nil || n != 1 {
		t.Fatalf("after kill and restart: %d rows, %v; want 1", n, err)
	}
}
