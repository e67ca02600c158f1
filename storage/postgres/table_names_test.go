package postgres

import (
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestTableNamesCutToOneColumn: PostgreSQL keeps 63 bytes of a name, so a key
// and a token column that differ only after that are one column and the
// Table is refused before anything is sent.
func TestTableNamesCutToOneColumn(t *testing.T) {
	long := strings.Repeat("k", 63)
	tbl := Table{Name: pgx.Identifier{"t"}, Key: long + "1", Token: long + "2"}
	if _, err := tbl.resolve(nil); !errors.Is(err, errInvalidArgument) {
		t.Fatalf("resolve = %v, want errInvalidArgument", err)
	}
	tbl = Table{Name: pgx.Identifier{"t"}, Key: "id"}
	if _, err := tbl.resolve([]Assignment{Set(long+"a", 1), Set(long+"b", 2)}); !errors.Is(err, errInvalidArgument) {
		t.Fatalf("resolve with two values cut to one column = %v, want errInvalidArgument", err)
	}
	if _, err := tbl.resolve([]Assignment{Set(long+"a", 1)}); err != nil {
		t.Fatalf("a long name of its own: %v", err)
	}
}
