package mysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"slices"
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
// Every method writes only under a strict sql_mode (STRICT_TRANS_TABLES or
// STRICT_ALL_TABLES, the server's default), where a key or value that does
// not fit its column is an error: under another mode the server would cut
// it short, and a key cut short names another row. The statement itself
// checks the session's mode; under one that is not strict it changes
// nothing and the method returns an error naming sql_mode. A NULL key (nil,
// a nil pointer, an invalid sql.Null*) is refused before anything is sent
// with an error matching [fence.ErrInvalid]. A table without the token and
// holder columns (or, for UpdateVersion, the version column) gets an error
// that gives the ALTER TABLE statement adding them.
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
	// The names as given, for the catalog.
	database, tableName, tokenCol, holderCol, versionCol string
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

		database:   t.Database,
		tableName:  t.Name,
		tokenCol:   c.Token,
		holderCol:  c.Holder,
		versionCol: c.Version,
	}, nil
}

// Operations whose statements are kept.
const (
	stmtUpdate = iota + 1
)

// stmt is a kept statement, the checked names it was written from and the
// start of its errors' messages.
type stmt struct {
	table table
	sql   string
	what  string
}

// statements are the kept statements (see sqlguard.Statements).
var statements sqlguard.Statements[*stmt]

// statement returns op's statement for t and the columns of values, written
// by build from t's checked names, or the error of the checks. It is kept
// for the next call with the same Table and columns.
func (t Table) statement(op int, values []Assignment, build func(table, []Assignment) string) (*stmt, error) {
	k, ok := sqlguard.KeyOf(op, t.Database, t.Name, t.Key, t.Token, t.Holder, t.Version, values, assignmentColumn)
	if ok {
		if st, found := statements.Load(k); found {
			return st, nil
		}
	}
	r, err := t.resolve(values)
	if err != nil {
		return nil, err
	}
	st := &stmt{table: r, sql: build(r, values), what: fmt.Sprintf("mysql: %s of %q", stmtOps[op], r.display)}
	if ok {
		statements.Keep(k, st)
	}
	return st, nil
}

// stmtOps names the operations in messages.
var stmtOps = [...]string{stmtUpdate: "Table.Update"}

func assignmentColumn(a Assignment) string { return a.Column }

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
// that ends after the statement may have reached the server returns an
// error matching [fence.ErrOutcomeUnknown]. A call that never sent its
// statement (on a *sql.DB, no connection could be dialled or greeted
// before ctx ended) returns a plain error matching its cause. ctx bounds
// the statements, and getting a connection.
func (t Table) Update(ctx context.Context, db Querier, f fence.Fence, key any, values ...Assignment) error {
	ctx, span := startSpan(ctx, "fencekit.mysql.table_update", &f)
	err := t.update(ctx, db, f, key, values...)
	endSpan(ctx, span, err)
	return err
}

func (t Table) update(ctx context.Context, db Querier, f fence.Fence, key any, values ...Assignment) error {
	const op = "Table.Update"
	if err := checkCall(ctx, db, "db"); err != nil {
		return err
	}
	if err := validate(op, f); err != nil {
		return err
	}
	st, err := t.statement(stmtUpdate, values, buildUpdate)
	if err != nil {
		return err
	}
	r := &st.table
	if err := r.checkKey(op, key); err != nil {
		return err
	}
	tok, h := int64(f.Token), f.Holder
	args := make([]any, 0, len(values)+6)
	for _, v := range values {
		args = append(args, v.Value)
	}
	args = append(args, tok, h, key, tok, tok, h)
	return onConn(ctx, db, st.what, func(q Querier) error {
		res, err := q.ExecContext(ctx, st.sql, args...)
		if err != nil {
			return writeError(q, st.what, r.markColumns(ctx, q, err, false))
		}
		if n, err := res.RowsAffected(); err != nil || n > 0 {
			return err
		}
		return r.checkMark(ctx, q, op, f, key, false)

	})
}

// buildUpdate writes Table.Update's statement for r and the columns of
// values; it takes the arguments: the values, token, holder, key, token,
// token, holder.
func buildUpdate(r table, values []Assignment) string {
	var sb strings.Builder
	sb.WriteString("UPDATE " + r.name + " SET ")
	for _, v := range values {
		sb.WriteString(quoteIdent(v.Column) + " = ?, ")
	}
	sb.WriteString(r.token + " = ?, " + r.holder + " = ? WHERE " + r.key + " = ? AND " + admitRowSQL(r.token, r.holder) + " AND " + strictSQL)
	return sb.String()
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
// [Table.Update]. A call that inserted a row never reports it not found:
// should the key column convert the key (a value of another type), the
// error says so. ctx bounds the statements.
func (t Table) Upsert(ctx context.Context, db Querier, f fence.Fence, key any, values ...Assignment) error {
	ctx, span := startSpan(ctx, "fencekit.mysql.table_upsert", &f)
	err := t.upsert(ctx, db, f, key, values...)
	endSpan(ctx, span, err)
	return err
}

func (t Table) upsert(ctx context.Context, db Querier, f fence.Fence, key any, values ...Assignment) error {
	const op = "Table.Upsert"
	if err := checkCall(ctx, db, "db"); err != nil {
		return err
	}
	if err := validate(op, f); err != nil {
		return err
	}
	r, err := t.resolve(values)
	if err != nil {
		return err
	}
	if err := r.checkKey(op, key); err != nil {
		return err
	}
	return onConn(ctx, db, fmt.Sprintf("mysql: %s of %q", op, r.display), func(q Querier) error {
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
		// INSERT ... SELECT rather than VALUES, for the WHERE: under a sql_mode
		// that would truncate the key or a value, nothing is inserted or
		// updated, and checkMark says why.
		query := "INSERT INTO " + r.name + " (" + strings.Join(cols, ", ") + ") SELECT ?" + strings.Repeat(", ?", len(cols)-1) +
			" FROM DUAL WHERE " + strictSQL + " ON DUPLICATE KEY UPDATE " + strings.Join(sets, ", ")
		res, err := q.ExecContext(ctx, query, args...)
		if err != nil {
			return writeError(q, fmt.Sprintf("mysql: %s into %q", op, r.display), r.markColumns(ctx, q, err, false))
		}
		if n, err := res.RowsAffected(); err != nil || n == rowsChanged {
			return err
		}
		return r.checkMark(ctx, q, op, f, key, true)

	})
}

// strictSQL is true when the session's sql_mode makes a value that does not
// fit its column an error rather than a truncated or converted value. A
// Table's statements write only when it holds: a key cut short could write
// another row than the caller's. Only the server knows the session's mode
// (a DSN, a SET, the server's default), so each statement asks it.
const strictSQL = "(FIND_IN_SET('STRICT_TRANS_TABLES', @@SESSION.sql_mode) > 0 OR FIND_IN_SET('STRICT_ALL_TABLES', @@SESSION.sql_mode) > 0)"

// sqlModeError is a Table's refusal to write under a sql_mode that is not
// strict.
func sqlModeError(op, display, mode string) error {
	return fmt.Errorf("mysql: %s on %q refused: sql_mode %q is not strict, so a key or value too long for its column would be cut short "+
		"(a key cut short names another row); add STRICT_TRANS_TABLES (the server's default) to sql_mode, "+
		"for example with sql_mode in the DSN; nothing was changed", op, display, mode)
}

// sessionModeSQL reports whether the session's sql_mode is strict, and
// the mode.
const sessionModeSQL = "SELECT " + strictSQL + ", @@SESSION.sql_mode"

// checkSQLMode returns sqlModeError unless the session's mode is strict.
func (r table) checkSQLMode(ctx context.Context, db Querier, op string) error {
	var strict bool
	var mode string
	if err := db.QueryRowContext(ctx, sessionModeSQL).Scan(&strict, &mode); err != nil {
		return prefixed(fmt.Sprintf("mysql: %s on %q: sql_mode", op, r.display), translate(err, false))
	}
	if !strict {
		return sqlModeError(op, r.display, mode)
	}
	return nil
}

// checkKey refuses a NULL key before anything is sent: NULL equals no key,
// and a nullable unique column holds any number of NULLs, so an Upsert
// would insert a new row every time.
func (r table) checkKey(op string, key any) error {
	return store.CheckKey(op, r.display, key)
}

// checkMark reads a row's mark after a fenced write that changed no row
// (or whose count was ambiguous): f's own mark means the write was
// admitted; any other is a refusal. upsert says the write was an Upsert,
// which leaves a row with key behind whenever the session's mode let it
// run.
func (r table) checkMark(ctx context.Context, db Querier, op string, f fence.Fence, key any, upsert bool) error {
	var token sql.NullInt64
	var holder sql.NullString
	var strict bool
	err := db.QueryRowContext(ctx, "SELECT "+r.token+", "+r.holder+", "+strictSQL+" FROM "+r.name+" WHERE "+r.key+" = ? FOR UPDATE", key).Scan(&token, &holder, &strict)
	if errors.Is(err, sql.ErrNoRows) {
		if err := r.checkSQLMode(ctx, db, op); err != nil {
			return err
		}
		if upsert {
			// The write ran and left no row that the key finds: the
			// column converted the key (a number of another type, a
			// string in a column of another kind).
			return fmt.Errorf("mysql: %s into %q wrote a row but finds no row with key %v: the key column converts that value; pass a key of the column's own type", op, r.display, key)
		}
		return prefixed(fmt.Sprintf("mysql: %s: %q key %v", op, r.display, key), fence.ErrNotFound)
	}
	if err != nil {
		return prefixed(fmt.Sprintf("mysql: %s: mark of %q key %v", op, r.display, key), translate(err, false))
	}
	if !strict {
		return r.checkSQLMode(ctx, db, op)
	}
	mark := fence.Fence{Resource: f.Resource, Token: fence.Token(token.Int64), Holder: holder.String}
	if token.Valid && mark.Token == f.Token && mark.Holder == f.Holder {
		return nil
	}
	return prefixed(fmt.Sprintf("mysql: %s: %q key %v", op, r.display, key), &fence.StaleError{Fence: f, HighWater: mark})
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
	const op = "Table.UpdateVersion"
	if err := checkCall(ctx, db, "db"); err != nil {
		return 0, err
	}
	r, err := t.resolve(values)
	if err != nil {
		return 0, err
	}
	if err := r.checkKey(op, key); err != nil {
		return 0, err
	}
	var next int64
	err = onConn(ctx, db, fmt.Sprintf("mysql: %s of %q", op, r.display), func(q Querier) error {
		var err error
		next, err = r.updateVersion(ctx, q, op, key, version, values)
		return err
	})
	return next, err
}

// updateVersion is [Table.UpdateVersion] on one session, after its checks.
func (r table) updateVersion(ctx context.Context, q Querier, op string, key any, version int64, values []Assignment) (int64, error) {
	var sb strings.Builder
	args := make([]any, 0, len(values)+2)
	sb.WriteString("UPDATE " + r.name + " SET ")
	for _, v := range values {
		sb.WriteString(quoteIdent(v.Column) + " = ?, ")
		args = append(args, v.Value)
	}
	sb.WriteString(r.version + " = " + r.version + " + 1 WHERE " + r.key + " = ? AND " + r.version + " = ? AND " + strictSQL)
	args = append(args, key, version)
	res, err := q.ExecContext(ctx, sb.String(), args...)
	if err != nil {
		return 0, writeError(q, fmt.Sprintf("mysql: %s of %q", op, r.display), r.markColumns(ctx, q, err, true))
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, err
	}
	if n > 0 {
		return version + 1, nil
	}
	var actual sql.NullInt64
	var strict bool
	err = q.QueryRowContext(ctx, "SELECT "+r.version+", "+strictSQL+" FROM "+r.name+" WHERE "+r.key+" = ?", key).Scan(&actual, &strict)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		if err := r.checkSQLMode(ctx, q, op); err != nil {
			return 0, err
		}
		return 0, prefixed(fmt.Sprintf("mysql: %s: %q key %v", op, r.display, key), fence.ErrNotFound)
	case err != nil:
		return 0, prefixed(fmt.Sprintf("mysql: %s: version of %q key %v", op, r.display, key), translate(err, false))
	case !strict:
		return 0, r.checkSQLMode(ctx, q, op)
	case !actual.Valid:
		return 0, prefixed(fmt.Sprintf("mysql: %s: %q key %v", op, r.display, key), ErrNullVersion)
	}
	return 0, &fence.ConflictError{Key: fmt.Sprintf("%s[%v]", r.display, key), Expected: version, Actual: actual.Int64}
}

// columnsSQL counts, for each of two column names, the columns of that
// name in the table (database ?, or the current one when it is empty;
// table ?). The catalog compares names case-insensitively, as MySQL does.
const columnsSQL = `SELECT COALESCE(SUM(COLUMN_NAME = ?), 0), COALESCE(SUM(COLUMN_NAME = ?), 0) FROM information_schema.COLUMNS
WHERE TABLE_SCHEMA = COALESCE(NULLIF(?, ''), DATABASE()) AND TABLE_NAME = ?`

// markColumns turns the server's error for an unknown column (1054) into
// one that names the fence columns (or, for UpdateVersion, the version
// column) the table lacks and the ALTER TABLE that adds them; other errors,
// and an unknown column of the caller's, come back as they are. MySQL
// keeps a transaction usable after such an error, so it asks the catalog
// on any Querier.
func (r table) markColumns(ctx context.Context, db Querier, err error, version bool) error {
	var myErr *mysql.MySQLError
	if !errors.As(err, &myErr) || myErr.Number != erBadField {
		return err
	}
	want := []string{r.tokenCol, r.holderCol}
	types := map[string]string{r.tokenCol: "BIGINT NULL", r.holderCol: "VARBINARY(1024) NULL"}
	if version {
		want = []string{r.versionCol, r.versionCol}
		types = map[string]string{r.versionCol: "BIGINT NOT NULL DEFAULT 1"}
	}
	var has [2]int
	if db.QueryRowContext(ctx, columnsSQL, want[0], want[1], r.database, r.tableName).Scan(&has[0], &has[1]) != nil {
		return err
	}
	var missing, adds []string
	for i, c := range want {
		if has[i] == 0 && !slices.Contains(missing, c) {
			missing = append(missing, c)
			adds = append(adds, "ADD COLUMN "+quoteIdent(c)+" "+types[c])
		}
	}
	if len(missing) == 0 {
		return err // a column of the caller's
	}
	fields := "in Table.Token and Table.Holder"
	what := "the columns of the row's fence"
	if version {
		fields, what = "in Table.Version", "its version column"
	}
	them := "them"
	if len(missing) == 1 {
		them = "it"
	}
	return fmt.Errorf("table %q lacks %s (missing %s); add %s with ALTER TABLE %s %s, or name the table's own %s: %w",
		r.display, what, strings.Join(missing, ", "), them, r.name, strings.Join(adds, ", "), fields, err)
}

// onConn runs fn on a connection of its own when db is a *sql.DB, and on db
// otherwise. Getting the connection first tells a call that never sent its
// statement (no connection could be dialled or greeted, or the pool stayed
// full until ctx ended: a plain error, matching its cause) from one whose
// statement may have reached the server; and the statement and the read
// that may follow it run in one session.
func onConn(ctx context.Context, db Querier, op string, fn func(q Querier) error) error {
	pool, ok := db.(*sql.DB)
	if !ok {
		return fn(db)
	}
	conn, err := pool.Conn(ctx)
	if err != nil {
		return prefixed(op+": no connection, nothing was sent", err)
	}
	defer conn.Close()
	return fn(conn)
}

// writeError describes a failed write. Outside a transaction the statement
// commits by itself, so an error that may have come after the statement
// reached the server leaves its outcome unknown. Known outcomes: the
// server's own answer (a *mysql.MySQLError), driver.ErrBadConn (the driver
// returns it only when it wrote nothing), sql.ErrConnDone (a closed
// *sql.Conn), an argument database/sql refused to convert (it converts
// them all before the driver sends anything) and a PostgreSQL server's
// reply (db is not MySQL, and no statement of a Table parses there: each
// quotes its names with backquotes). Inside a transaction, which cannot
// commit after such an error, every error is plain.
func writeError(db Querier, op string, err error) error {
	var myErr *mysql.MySQLError
	_, inTx := db.(*sql.Tx)
	if inTx || errors.As(err, &myErr) || errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrConnDone) || postgresReply(err) {
		return prefixed(op, translate(err, false))
	}
	if sqlguard.ArgumentRefused(err) {
		return prefixed(op+": not sent", err)
	}
	return &fence.OutcomeUnknownError{Op: op, Err: err}
}
