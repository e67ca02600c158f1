package pgcore

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// MaxNameLen is the longest identifier PostgreSQL keeps (NAMEDATALEN - 1
// bytes); it cuts a longer one, at a character boundary, in DDL and queries
// alike.
const MaxNameLen = 63

// KeptName is the name PostgreSQL keeps for identifier s.
func KeptName(s string) string {
	if len(s) <= MaxNameLen {
		return s
	}
	n := MaxNameLen
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// Quote quotes name as one identifier.
func Quote(name string) string { return pgx.Identifier{name}.Sanitize() }

// NamedColumns returns those of cols that msg, the server's message for an
// undefined column (42703), names.
func NamedColumns(msg string, cols ...string) []string {
	var named []string
	for _, c := range cols {
		if strings.Contains(msg, `"`+c+`"`) || strings.Contains(msg, "."+c+" ") {
			named = append(named, c)
		}
	}
	return named
}

// MarkColumnsHint is the message for a fenced write to table (display name;
// quoted is the name as sent) that lacks its mark's columns: it names the
// missing ones and the ALTER TABLE that adds add, each with its type from
// types. field names the Table fields that rename them.
func MarkColumnsHint(display, quoted string, missing, add []string, types map[string]string) string {
	alters := make([]string, len(add))
	for i, c := range add {
		alters[i] = "ADD COLUMN IF NOT EXISTS " + Quote(c) + " " + types[c]
	}
	return fmt.Sprintf("table %q lacks the columns of the row's fence (missing %s); add them with ALTER TABLE %s %s, or name the table's own in Table.Token and Table.Holder",
		display, strings.Join(missing, ", "), quoted, strings.Join(alters, ", "))
}

// VersionColumnHint is the message for a versioned update of table that
// lacks its version column.
func VersionColumnHint(display, quoted, column string) string {
	return fmt.Sprintf("table %q lacks the version column %q; add it with ALTER TABLE %s ADD COLUMN IF NOT EXISTS %s bigint NOT NULL DEFAULT 1, or name the table's own in Table.Version",
		display, column, quoted, Quote(column))
}
