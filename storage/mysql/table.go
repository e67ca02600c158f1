package mysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/go-sql-driver/mysql"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/sqlguard"
)

// Default column names of a [Table].
const (
	DefaultTokenColumn   = "fence_token"
	DefaultHolderColumn  = "fence_holder"
	DefaultVersionColumn = "version"
)

// maxIdentLen is MySQL's limit on table and column names, in characters.
const maxIdentLen = 64

// Table describes a table whose rows carry their own fence (a token and a
// holder column) or version column, for row-level fencing with
// [Table.Update] and [Table.Upsert] and optimistic locking with
// [Table.UpdateVersion]. A Table is a plain value, safe to share.
//
// Names are quoted between backticks (doubling any backtick in them) after
// validation: 1 to 64 characters of valid UTF-8 from Unicode's Basic
// Multilingual Plane, no NUL, no trailing space, as MySQL requires of quoted
// names. Key, Token, Holder and Version, after defaults, must name four
// different columns, and no [Assignment] may name any of them: otherwise a fenced
// write could put the token into the key, or UpdateVersion bump it. Every
// method refuses a Table or values that break these rules with an error
// matching [fence.ErrInvalid] before sending anything.
//
// Give the holder column a binary type (VARBINARY(1024), or a utf8mb4 column
// with a binary, no-pad collation) so that holders compare byte for byte.
//
// A row's own mark and the guard table's marks ([Guard], [InTx]) know nothing
// of each other: a write fenced by one is not checked against marks in the
// other, even for the same resource and token. Fence every write to a piece
// of data the same way. Likewise, fenced writes do not bump the version
// column, so [Table.UpdateVersion] does not notice them.
type Table struct {
	// Database is the database (schema) holding the table.
	// default: the connection's current database
	Database string
	// Name is the table. Required.
	Name string
	// Key is the column that identifies a row; it must be the table's
	// primary key or a unique key. Required.
	Key string
	// Token is the BIGINT column holding the row's high-water token (NULL
	// counts as no mark). default: "fence_token"
	Token string
	// Holder is the column holding the row's high-water holder.
	// default: "fence_holder"
	Holder string
	// Version is the BIGINT column that UpdateVersion compares and bumps.
	// default: "version"
	Version string
}

// Assignment assigns a value to a column in an update or insert.
type Assignment struct {
	// Column is the column name, quoted as an identifier.
	Column string
	// Value is sent as a placeholder's argument.
	Value any
}

// Set returns the [Assignment] that assigns v to column.
func Set(column string, v any) Assignment { return Assignment{Column: column, Value: v} }

// table holds the quoted names of a validated Table.
type table struct {
	name, key, token, holder, version string
	display                           string
}

// resolve validates t and values before anything is sent.
func (t Table) resolve(values []Assignment) (table, error) {
	display := t.Name
	if t.Database != "" {
		display = t.Database + "." + t.Name
	}
	if err := checkIdent(display, "table name", t.Name); err != nil {
		return table{}, err
	}
	name := quoteIdent(t.Name)
	if t.Database != "" {
		if err := checkIdent(display, "database name", t.Database); err != nil {
			return table{}, err
		}
		name = quoteIdent(t.Database) + "." + name
	}
	c := sqlguard.Columns{
		Key:     t.Key,
		Token:   orDefault(t.Token, DefaultTokenColumn),
		Holder:  orDefault(t.Holder, DefaultHolderColumn),
		Version: orDefault(t.Version, DefaultVersionColumn),
	}
	err := store.CheckColumns(display, c, valueColumns(values), sqlguard.Dialect{
		Check: func(what, name string) error { return checkIdent(display, what, name) },
		// MySQL compares column names case-insensitively.
		Kept: strings.ToLower,
		Clash: func(first, second, name string) error {
			return invalid("table %q: %s and %s columns are both %q; they must differ", display, first, second, name)
		},
	})
	if err != nil {
		return table{}, err
	}
	return table{
		name:    name,
		key:     quoteIdent(c.Key),
		token:   quoteIdent(c.Token),
		holder:  quoteIdent(c.Holder),
		version: quoteIdent(c.Version),
		display: display,
	}, nil
}

// checkIdent refuses a name that MySQL cannot hold as a quoted identifier.
func checkIdent(table, what, name string) error {
	switch {
	case name == "":
		return invalid("table %q: empty %s", table, what)
	case !utf8.ValidString(name):
		return invalid("table %q: %s %q is not valid UTF-8", table, what, name)
	case strings.IndexByte(name, 0) >= 0:
		return invalid("table %q: %s %q holds a NUL byte", table, what, name)
	case utf8.RuneCountInString(name) > maxIdentLen:
		return invalid("table %q: %s %q is longer than %d characters", table, what, name, maxIdentLen)
	case strings.HasSuffix(name, " "):
		return invalid("table %q: %s %q ends with a space, which MySQL names cannot", table, what, name)
	}
	for _, r := range name {
		if r > 0xFFFF {
			return invalid("table %q: %s %q holds %U, outside the Basic Multilingual Plane that MySQL names allow", table, what, name, r)
		}
	}
	return nil
}

// quoteIdent quotes a validated name as a MySQL identifier.
func quoteIdent(name string) string {
	return "`" + strings.ReplaceAll(name, "`", "``") + "`"
}

// valueColumns returns the columns values assign, in order.
func valueColumns(values []Assignment) []string {
	cols := make([]string, len(values))
	for i, v := range values {
		cols[i] = v.Column
	}
	return cols
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// admitRowSQL is the admission rule on a row's own columns; it takes the
// arguments (token, token, holder). A NULL token is no mark.
func admitRowSQL(tokenCol, holderCol string) string {
	return "(" + tokenCol + " IS NULL OR " + tokenCol + " < ? OR (" + tokenCol + " = ? AND " + holderCol + " = ?))"
}

// Update writes values to the row whose key column equals key, if the row's
// own mark admits f ([fence.Admits]), and sets the mark to (f.Token,
// f.Holder) in the same statement. With no values it only raises the mark:
// inside a transaction that is the fenced read of a row, after which the
// row is locked until the transaction ends.
//
// A refused f returns a [*fence.StaleError] carrying the row's mark (its
// Resource is f.Resource); a missing row returns an error matching
// [fence.ErrNotFound]. Either way nothing changed. When no row changed, a
// second statement reads the row's mark to tell a refusal from a missing
// row and from an admitted write that changed nothing (the same fence and
// values again, which MySQL counts as 0 rows unless clientFoundRows is
// set). Pass a *sql.Tx to make that read exact; on a *sql.DB a newer holder
// admitted between the two statements makes such a write report stale.
//
// On a *sql.DB or *sql.Conn (autocommit), a connection that breaks or a ctx
// that ends after the statement was sent returns an error matching
// [fence.ErrOutcomeUnknown]. ctx bounds the statements.
func (t Table) Update(ctx context.Context, db Querier, f fence.Fence, key any, values ...Assignment) error {
	ctx, span := startSpan(ctx, "fencekit.mysql.table_update", &f)
	err := t.update(ctx, db, f, key, values...)
	endSpan(ctx, span, err)
	return err
}

func (t Table) update(ctx context.Context, db Querier, f fence.Fence, key any, values ...Assignment) error {
	if err := checkCall(ctx, db, "db"); err != nil {
		return err
	}
	if err := validate(f); err != nil {
		return err
	}
	r, err := t.resolve(values)
	if err != nil {
		return err
	}
	var sb strings.Builder
	args := make([]any, 0, len(values)+6)
	sb.WriteString("UPDATE " + r.name + " SET ")
	for _, v := range values {
		sb.WriteString(quoteIdent(v.Column) + " = ?, ")
		args = append(args, v.Value)
	}
	tok, h := int64(f.Token), f.Holder
	sb.WriteString(r.token + " = ?, " + r.holder + " = ? WHERE " + r.key + " = ? AND " + admitRowSQL(r.token, r.holder))
	args = append(args, tok, h, key, tok, tok, h)
	res, err := db.ExecContext(ctx, sb.String(), args...)
	if err != nil {
		return writeError(db, fmt.Sprintf("mysql: fenced update of %q", r.display), err)
	}
	if n, err := res.RowsAffected(); err != nil || n > 0 {
		return err
	}
	return r.checkMark(ctx, db, f, key)
}

// Upsert inserts the row (key, values) with mark (f.Token, f.Holder), or, if
// a row with that key exists, updates it as [Table.Update] does: only if its
// mark admits f. A refused f returns a [*fence.StaleError] carrying the
// row's mark, and nothing changed.
//
// It is an INSERT ... ON DUPLICATE KEY UPDATE, which MySQL applies to
// whichever unique key the new row collides with: Key must be the table's
// only unique key (its primary key), or a collision on another one updates
// that other row. When the affected-row count cannot tell an insert or an
// admitted update from a refusal (clientFoundRows, or a write that changed
// nothing), the row's mark is read in a second statement, as for
// [Table.Update]. ctx bounds the statements.
func (t Table) Upsert(ctx context.Context, db Querier, f fence.Fence, key any, values ...Assignment) error {
	ctx, span := startSpan(ctx, "fencekit.mysql.table_upsert", &f)
	err := t.upsert(ctx, db, f, key, values...)
	endSpan(ctx, span, err)
	return err
}

func (t Table) upsert(ctx context.Context, db Querier, f fence.Fence, key any, values ...Assignment) error {
	if err := checkCall(ctx, db, "db"); err != nil {
		return err
	}
	if err := validate(f); err != nil {
		return err
	}
	r, err := t.resolve(values)
	if err != nil {
		return err
	}
	tok, h := int64(f.Token), f.Holder
	cols := []string{r.key, r.token, r.holder}
	args := make([]any, 0, 2*len(values)+14)
	args = append(args, key, tok, h)
	for _, v := range values {
		cols = append(cols, quoteIdent(v.Column))
		args = append(args, v.Value)
	}
	// Values first, then holder, then token: each condition sees the mark
	// as it was, or (for token, under MySQL's left-to-right assignment) a
	// holder raised only if the token is admitted, which leaves the answer
	// unchanged. See guardSQL.
	admit := admitRowSQL(r.token, r.holder)
	sets := make([]string, 0, len(values)+2)
	for _, v := range values {
		c := quoteIdent(v.Column)
		sets = append(sets, c+" = IF("+admit+", ?, "+c+")")
		args = append(args, tok, tok, h, v.Value)
	}
	sets = append(sets, r.holder+" = IF("+admit+", ?, "+r.holder+")", r.token+" = IF("+admit+", ?, "+r.token+")")
	args = append(args, tok, tok, h, h, tok, tok, h, tok)
	query := "INSERT INTO " + r.name + " (" + strings.Join(cols, ", ") + ") VALUES (?" + strings.Repeat(", ?", len(cols)-1) +
		") ON DUPLICATE KEY UPDATE " + strings.Join(sets, ", ")
	res, err := db.ExecContext(ctx, query, args...)
	if err != nil {
		return writeError(db, fmt.Sprintf("mysql: fenced upsert into %q", r.display), err)
	}
	if n, err := res.RowsAffected(); err != nil || n == rowsChanged {
		return err
	}
	return r.checkMark(ctx, db, f, key)
}

// checkMark reads a row's mark after a fenced write that changed no row
// (or whose count was ambiguous): f's own mark means the write was
// admitted; any other is a refusal.
func (r table) checkMark(ctx context.Context, db Querier, f fence.Fence, key any) error {
	var token sql.NullInt64
	var holder sql.NullString
	err := db.QueryRowContext(ctx, "SELECT "+r.token+", "+r.holder+" FROM "+r.name+" WHERE "+r.key+" = ? FOR UPDATE", key).Scan(&token, &holder)
	if errors.Is(err, sql.ErrNoRows) {
		return prefixed(fmt.Sprintf("mysql: %q key %v", r.display, key), fence.ErrNotFound)
	}
	if err != nil {
		return prefixed(fmt.Sprintf("mysql: mark of %q key %v", r.display, key), translate(err, false))
	}
	mark := fence.Fence{Resource: f.Resource, Token: fence.Token(token.Int64), Holder: holder.String}
	if token.Valid && mark.Token == f.Token && mark.Holder == f.Holder {
		return nil
	}
	return prefixed(fmt.Sprintf("mysql: %q key %v", r.display, key), &fence.StaleError{Fence: f, HighWater: mark})
}

// UpdateVersion writes values to the row whose key column equals key only if
// its version column still equals version, the version the caller read, and
// bumps the version by one in the same statement; it returns the new
// version. Any write in between makes it return a [*fence.ConflictError]
// (errors.Is(err, fence.ErrConflict)) with the version found; a missing row
// returns an error matching [fence.ErrNotFound]. Either way nothing changed:
// read again and retry, for example with [Retry]. A row whose version column
// is NULL can never match and returns an error matching [ErrNullVersion]
// instead of a conflict. The bump always changes the row, so the result does
// not depend on clientFoundRows. ctx bounds the statements.
func (t Table) UpdateVersion(ctx context.Context, db Querier, key any, version int64, values ...Assignment) (int64, error) {
	ctx, span := startSpan(ctx, "fencekit.mysql.table_update_version", nil)
	next, err := t.updateVersion(ctx, db, key, version, values...)
	endSpan(ctx, span, err)
	return next, err
}

func (t Table) updateVersion(ctx context.Context, db Querier, key any, version int64, values ...Assignment) (int64, error) {
	if err := checkCall(ctx, db, "db"); err != nil {
		return 0, err
	}
	r, err := t.resolve(values)
	if err != nil {
		return 0, err
	}
	var sb strings.Builder
	args := make([]any, 0, len(values)+2)
	sb.WriteString("UPDATE " + r.name + " SET ")
	for _, v := range values {
		sb.WriteString(quoteIdent(v.Column) + " = ?, ")
		args = append(args, v.Value)
	}
	sb.WriteString(r.version + " = " + r.version + " + 1 WHERE " + r.key + " = ? AND " + r.version + " = ?")
	args = append(args, key, version)
	res, err := db.ExecContext(ctx, sb.String(), args...)
	if err != nil {
		return 0, writeError(db, fmt.Sprintf("mysql: versioned update of %q", r.display), err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, err
	}
	if n > 0 {
		return version + 1, nil
	}
	var actual sql.NullInt64
	err = db.QueryRowContext(ctx, "SELECT "+r.version+" FROM "+r.name+" WHERE "+r.key+" = ?", key).Scan(&actual)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return 0, prefixed(fmt.Sprintf("mysql: %q key %v", r.display, key), fence.ErrNotFound)
	case err != nil:
		return 0, prefixed(fmt.Sprintf("mysql: version of %q key %v", r.display, key), translate(err, false))
	case !actual.Valid:
		return 0, prefixed(fmt.Sprintf("mysql: %q key %v", r.display, key), ErrNullVersion)
	}
	return 0, &fence.ConflictError{Key: fmt.Sprintf("%s[%v]", r.display, key), Expected: version, Actual: actual.Int64}
}

// writeError describes a failed write. Outside a transaction the statement
// commits by itself, so an error that is neither the server's answer nor a
// connection the driver never wrote to leaves its outcome unknown; inside
// one, the transaction cannot commit after such an error.
func writeError(db Querier, op string, err error) error {
	var myErr *mysql.MySQLError
	_, inTx := db.(*sql.Tx)
	if inTx || errors.As(err, &myErr) || errors.Is(err, driver.ErrBadConn) {
		return prefixed(op, translate(err, false))
	}
	return &fence.OutcomeUnknownError{Op: op, Err: err}
}
