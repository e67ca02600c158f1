package pgsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/pgcore"
	"github.com/fencekit/fencekit/internal/sqlguard"
)

// Default column names of a [Table].
const (
	DefaultTokenColumn   = "fence_token"
	DefaultHolderColumn  = "fence_holder"
	DefaultVersionColumn = "version"
)

// Table describes a table whose rows carry their own fence (a token and a
// holder column) or version column, for row-level fencing with
// [Table.Update] and [Table.Upsert] and optimistic locking with
// [Table.UpdateVersion]. Each method is one statement (a second one only to
// tell why no row changed). Names are only ever quoted as identifiers, so
// any string without a NUL byte is safe as a name. A Table is a plain value,
// safe to share.
//
// Key, Token, Holder and Version, after defaults, must name four different
// columns (as PostgreSQL keeps names: cut to 63 bytes), and no [Assignment]
// may name any of them: otherwise a fenced write could put the token into
// the key, or UpdateVersion bump it. Every method refuses such a Table, and
// names holding NUL bytes, with an error matching [fence.ErrInvalid] before
// sending anything. So is a NULL key (nil, a nil pointer, a driver.Valuer
// that yields nil such as an invalid sql.Null* or a pgtype value that is not
// Valid): NULL equals no key, and a nullable unique key column holds any
// number of NULLs, so an Upsert would insert a new row under any fence, a
// stale one included.
//
// A fenced write to a table that lacks the token or holder column, or a
// versioned one to a table that lacks the version column, returns an error
// naming the missing columns and the ALTER TABLE that adds them (wrapping
// the driver's error, SQLSTATE 42703).
//
// A row's own mark and the guard table's marks ([Guard], [InTx]) know
// nothing of each other: a write fenced by one is not checked against marks
// in the other, even for the same resource and token. Fence every write to a
// piece of data the same way. Likewise, fenced writes do not bump the
// version column, so [Table.UpdateVersion] does not notice them.
//
// On a *sql.DB or *sql.Conn each write commits by itself. A write whose
// reply is cut off (its ctx ends or its connection breaks after it was
// sent) returns an error matching [fence.ErrOutcomeUnknown]: it may have
// been applied.
type Table struct {
	// Schema is the schema holding the table.
	// default: the connection's search_path
	Schema string
	// Name is the table. Required.
	Name string
	// Key is the column that identifies a row; it must be unique (a primary
	// key or unique constraint, which Upsert's ON CONFLICT needs). Required.
	Key string
	// Token is the bigint column holding the row's high-water token (NULL
	// counts as no mark). default: "fence_token"
	Token string
	// Holder is the text column holding the row's high-water holder.
	// default: "fence_holder"
	Holder string
	// Version is the bigint column that UpdateVersion compares and bumps.
	// default: "version"
	Version string
}

// Assignment assigns a value to a column in an update or insert.
type Assignment struct {
	// Column is the column name, quoted as an identifier.
	Column string
	// Value is sent as a parameter.
	Value any
}

// Set returns the [Assignment] that assigns v to column.
func Set(column string, v any) Assignment { return Assignment{Column: column, Value: v} }

// table holds the quoted names of a validated Table, and the managed
// columns' own names for messages.
type table struct {
	name, key, token, holder, version string
	display                           string
	tokenCol, holderCol, versionCol   string
}

// resolve validates t and values before anything is sent.
func (t Table) resolve(values []Assignment) (table, error) {
	display := t.Name
	if t.Schema != "" {
		display = t.Schema + "." + t.Name
	}
	if err := checkIdent(display, "table name", t.Name); err != nil {
		return table{}, err
	}
	name := pgcore.Quote(t.Name)
	if t.Schema != "" {
		if err := checkIdent(display, "schema name", t.Schema); err != nil {
			return table{}, err
		}
		name = pgcore.Quote(t.Schema) + "." + name
	}
	c := sqlguard.Columns{
		Key:     t.Key,
		Token:   orDefault(t.Token, DefaultTokenColumn),
		Holder:  orDefault(t.Holder, DefaultHolderColumn),
		Version: orDefault(t.Version, DefaultVersionColumn),
	}
	err := store.CheckColumns(display, c, valueColumns(values), sqlguard.Dialect{
		Check: func(what, name string) error { return checkIdent(display, what, name) },
		Kept:  pgcore.KeptName,
		Clash: func(first, second, name string) error {
			return invalid("table %q: %s and %s columns are both %q (as PostgreSQL keeps the name); they must differ", display, first, second, pgcore.KeptName(name))
		},
	})
	if err != nil {
		return table{}, err
	}
	return table{
		name:       name,
		key:        pgcore.Quote(c.Key),
		token:      pgcore.Quote(c.Token),
		holder:     pgcore.Quote(c.Holder),
		version:    pgcore.Quote(c.Version),
		display:    display,
		tokenCol:   c.Token,
		holderCol:  c.Holder,
		versionCol: c.Version,
	}, nil
}

// Operations whose statements are kept.
const (
	stmtUpdate = iota + 1
)

// stmt is a kept statement and the checked names it was written from.
type stmt struct {
	table table
	sql   string
}

// statements are the kept statements (see sqlguard.Statements).
var statements sqlguard.Statements[*stmt]

// statement returns op's statement for t and the columns of values, written
// by build from t's checked names, or the error of the checks. It is kept
// for the next call with the same Table and columns.
func (t Table) statement(op int, values []Assignment, build func(table, []Assignment) string) (*stmt, error) {
	k, ok := sqlguard.KeyOf(op, t.Schema, t.Name, t.Key, t.Token, t.Holder, t.Version, values, assignmentColumn)
	if ok {
		if st, found := statements.Load(k); found {
			return st, nil
		}
	}
	r, err := t.resolve(values)
	if err != nil {
		return nil, err
	}
	st := &stmt{table: r, sql: build(r, values)}
	if ok {
		statements.Keep(k, st)
	}
	return st, nil
}

func assignmentColumn(a Assignment) string { return a.Column }

// checkIdent refuses an empty name or one holding a NUL byte, which quoting
// would silently drop, turning one name into another.
func checkIdent(table, what, name string) error {
	switch {
	case name == "":
		return invalid("table %q: empty %s", table, what)
	case strings.IndexByte(name, 0) >= 0:
		return invalid("table %q: %s %q holds a NUL byte, which PostgreSQL names cannot", table, what, name)
	}
	return nil
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

// Update writes values to the row whose key column equals key, if the row's
// own mark admits f ([fence.Admits]), and sets the mark to (f.Token,
// f.Holder) in the same statement. With no values it only raises the mark:
// inside a transaction that is the fenced read of a row, after which the
// row is locked until the transaction ends.
//
// A refused f returns an error wrapping a [*fence.StaleError] carrying the
// row's mark (its Resource is f.Resource); a missing row returns an error
// matching [fence.ErrNotFound]. Either way nothing changed. Telling them
// apart takes a second statement, only when no row was updated. ctx bounds
// the statements.
func (t Table) Update(ctx context.Context, db Querier, f fence.Fence, key any, values ...Assignment) error {
	ctx, span := startSpan(ctx, "fencekit.pgsql.table_update", &f)
	err := t.update(ctx, db, f, key, values...)
	endSpan(ctx, span, err)
	return err
}

func (t Table) update(ctx context.Context, db Querier, f fence.Fence, key any, values ...Assignment) error {
	if err := checkCall(ctx, db, "db"); err != nil {
		return err
	}
	if err := checkFence("Table.Update", f); err != nil {
		return err
	}
	st, err := t.statement(stmtUpdate, values, buildUpdate)
	if err != nil {
		return err
	}
	r := &st.table
	if err := store.CheckKey("Table.Update", r.display, key); err != nil {
		return err
	}
	args := make([]any, 0, len(values)+3)
	args = append(args, key, int64(f.Token), f.Holder)
	for _, v := range values {
		args = append(args, v.Value)
	}
	return onConn(ctx, db, func(db Querier) error {
		res, err := db.ExecContext(ctx, st.sql, args...)
		if err != nil {
			return writeError(db, "pgsql: Table.Update", fmt.Sprintf("pgsql: fenced update of %q", r.display), r.markColumns(ctx, db, err))
		}
		if n, err := res.RowsAffected(); err != nil || n > 0 {
			return err
		}
		return r.refusal(ctx, db, f, key)
	})
}

// buildUpdate writes Table.Update's statement for r and the columns of
// values; it takes the arguments key, token, holder and the values.
func buildUpdate(r table, values []Assignment) string {
	var sb strings.Builder
	sb.WriteString("UPDATE " + r.name + " SET ")
	for i, v := range values {
		sb.WriteString(pgcore.Quote(v.Column) + " = $" + strconv.Itoa(i+4) + ", ")
	}
	sb.WriteString(r.token + " = $2, " + r.holder + " = $3 WHERE " + r.key + " = $1 AND " + pgcore.AdmitRowSQL(r.token, r.holder))
	return sb.String()
}

// Upsert inserts the row (key, values) with mark (f.Token, f.Holder), or, if
// a row with that key exists, updates it as [Table.Update] does: only if its
// mark admits f. A refused f returns an error wrapping a [*fence.StaleError]
// carrying the row's mark, and nothing changed. ctx bounds the statements.
func (t Table) Upsert(ctx context.Context, db Querier, f fence.Fence, key any, values ...Assignment) error {
	ctx, span := startSpan(ctx, "fencekit.pgsql.table_upsert", &f)
	err := t.upsert(ctx, db, f, key, values...)
	endSpan(ctx, span, err)
	return err
}

func (t Table) upsert(ctx context.Context, db Querier, f fence.Fence, key any, values ...Assignment) error {
	if err := checkCall(ctx, db, "db"); err != nil {
		return err
	}
	if err := checkFence("Table.Upsert", f); err != nil {
		return err
	}
	r, err := t.resolve(values)
	if err != nil {
		return err
	}
	if err := store.CheckKey("Table.Upsert", r.display, key); err != nil {
		return err
	}
	cols := []string{r.key, r.token, r.holder}
	params := []string{"$1", "$2", "$3"}
	args := make([]any, 0, len(values)+3)
	args = append(args, key, int64(f.Token), f.Holder)
	for _, v := range values {
		args = append(args, v.Value)
		cols = append(cols, pgcore.Quote(v.Column))
		params = append(params, "$"+strconv.Itoa(len(args)))
	}
	sets := make([]string, 0, len(cols)-1)
	for _, c := range cols[1:] {
		sets = append(sets, c+" = EXCLUDED."+c)
	}
	// The alias keeps the admission about the existing row; the parameters
	// are the incoming fence.
	query := "INSERT INTO " + r.name + " AS cur (" + strings.Join(cols, ", ") + ") VALUES (" + strings.Join(params, ", ") +
		") ON CONFLICT (" + r.key + ") DO UPDATE SET " + strings.Join(sets, ", ") +
		" WHERE " + pgcore.AdmitRowSQL("cur."+r.token, "cur."+r.holder)
	return onConn(ctx, db, func(db Querier) error {
		res, err := db.ExecContext(ctx, query, args...)
		if err != nil {
			return writeError(db, "pgsql: Table.Upsert", fmt.Sprintf("pgsql: fenced upsert into %q", r.display), r.markColumns(ctx, db, err))
		}
		if n, err := res.RowsAffected(); err != nil || n > 0 {
			return err
		}
		return r.refusal(ctx, db, f, key)
	})
}

// markColumns turns the server's error for a missing token or holder column
// (SQLSTATE 42703) into one that names the missing columns and the statement
// that adds them; other errors come back as they are. Outside a transaction
// it asks the catalog which of the two are missing; in one, which the failed
// statement aborted, it names the column the server named and adds both,
// each only if missing.
func (r table) markColumns(ctx context.Context, db Querier, err error) error {
	s, ok := pgcore.AsServerError(err)
	if !ok || s.Code != pgcore.CodeUndefinedColumn {
		return err
	}
	missing := pgcore.NamedColumns(s.Message, r.tokenCol, r.holderCol)
	if len(missing) == 0 {
		return err // a column of the caller's
	}
	add := []string{r.tokenCol, r.holderCol}
	if _, inTx := db.(*sql.Tx); !inTx {
		var absent string
		if qerr := db.QueryRowContext(ctx, pgcore.MissingMarkColumnsSQL, r.name, r.tokenCol, r.holderCol).Scan(&absent); qerr == nil && absent != "" {
			missing = strings.Split(absent, ",")
			add = missing
		}
	}
	types := map[string]string{r.tokenCol: "bigint", r.holderCol: "text"}
	return &hintError{hint: pgcore.MarkColumnsHint(r.display, r.name, missing, add, types), err: err}
}

// hintError is a server error with what to do about it.
type hintError struct {
	hint string
	err  error
}

func (e *hintError) Error() string { return e.hint + ": " + e.err.Error() }
func (e *hintError) Unwrap() error { return e.err }

// refusal tells a stale fence from a missing row after a fenced write
// touched no row.
func (r table) refusal(ctx context.Context, db Querier, f fence.Fence, key any) error {
	var token sql.NullInt64
	var holder sql.NullString
	err := db.QueryRowContext(ctx, "SELECT "+r.token+", "+r.holder+" FROM "+r.name+" WHERE "+r.key+" = $1", key).Scan(&token, &holder)
	if errors.Is(err, sql.ErrNoRows) {
		return prefixed(fmt.Sprintf("pgsql: %q key %v", r.display, key), fence.ErrNotFound)
	}
	if err != nil {
		return prefixed(fmt.Sprintf("pgsql: mark of %q key %v", r.display, key), translate(err))
	}
	mark := fence.Fence{Resource: f.Resource, Token: fence.Token(token.Int64), Holder: holder.String}
	return prefixed(fmt.Sprintf("pgsql: %q key %v", r.display, key), &fence.StaleError{Fence: f, HighWater: mark})
}

// UpdateVersion writes values to the row whose key column equals key only if
// its version column still equals version, the version the caller read, and
// bumps the version by one in the same statement; it returns the new
// version. Any write in between makes it return a [*fence.ConflictError]
// (errors.Is(err, fence.ErrConflict)) with the version found; a missing row
// returns an error matching [fence.ErrNotFound]. Either way nothing changed:
// read again and retry, for example with [Retry]. A row whose version column
// is NULL can never match and returns an error matching [ErrNullVersion]
// instead of a conflict. ctx bounds the statements.
func (t Table) UpdateVersion(ctx context.Context, db Querier, key any, version int64, values ...Assignment) (int64, error) {
	ctx, span := startSpan(ctx, "fencekit.pgsql.table_update_version", nil)
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
	if err := store.CheckKey("Table.UpdateVersion", r.display, key); err != nil {
		return 0, err
	}
	var sb strings.Builder
	args := make([]any, 0, len(values)+2)
	args = append(args, key, version)
	sb.WriteString("UPDATE " + r.name + " SET ")
	for _, v := range values {
		args = append(args, v.Value)
		sb.WriteString(pgcore.Quote(v.Column) + " = $" + strconv.Itoa(len(args)) + ", ")
	}
	sb.WriteString(r.version + " = " + r.version + " + 1 WHERE " + r.key + " = $1 AND " + r.version + " = $2 RETURNING " + r.version)
	var next int64
	err = onConn(ctx, db, func(db Querier) error {
		var err error
		next, err = r.updateVersion(ctx, db, sb.String(), args, key, version)
		return err
	})
	return next, err
}

func (r table) updateVersion(ctx context.Context, db Querier, query string, args []any, key any, version int64) (int64, error) {
	var next int64
	err := db.QueryRowContext(ctx, query, args...).Scan(&next)
	if err == nil {
		return next, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return 0, writeError(db, "pgsql: Table.UpdateVersion", fmt.Sprintf("pgsql: versioned update of %q", r.display), r.versionColumn(err))
	}
	var actual sql.NullInt64
	err = db.QueryRowContext(ctx, "SELECT "+r.version+" FROM "+r.name+" WHERE "+r.key+" = $1", key).Scan(&actual)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return 0, prefixed(fmt.Sprintf("pgsql: %q key %v", r.display, key), fence.ErrNotFound)
	case err != nil:
		return 0, prefixed(fmt.Sprintf("pgsql: version of %q key %v", r.display, key), translate(err))
	case !actual.Valid:
		return 0, prefixed(fmt.Sprintf("pgsql: %q key %v", r.display, key), ErrNullVersion)
	}
	return 0, &fence.ConflictError{Key: fmt.Sprintf("%s[%v]", r.display, key), Expected: version, Actual: actual.Int64}
}

// versionColumn turns the server's error for a missing version column into
// one that gives the ALTER TABLE that adds it.
func (r table) versionColumn(err error) error {
	s, ok := pgcore.AsServerError(err)
	if !ok || s.Code != pgcore.CodeUndefinedColumn || len(pgcore.NamedColumns(s.Message, r.versionCol)) == 0 {
		return err
	}
	return &hintError{hint: pgcore.VersionColumnHint(r.display, r.name, r.versionCol), err: err}
}

// onConn runs fn with db or, when db is a *sql.DB, with a connection taken
// from it for fn's statements. A connection that cannot be had (or opened)
// is then an error before anything was sent, which a write's error could
// not tell apart from a reply lost in flight; and database/sql does not
// resend, on another connection, a write whose connection broke.
func onConn(ctx context.Context, db Querier, fn func(Querier) error) error {
	pool, ok := db.(*sql.DB)
	if !ok {
		return fn(db)
	}
	conn, err := pool.Conn(ctx)
	if err != nil {
		return prefixed("pgsql: connection", err)
	}
	defer conn.Close()
	return fn(conn)
}

// writeError describes a failed write, the call op. Inside a transaction the
// write commits only with it, so the error is the statement's. Outside one
// the statement commits by itself, and only a server error reply, or an
// argument refused before the statement was sent (by database/sql or by
// pgx's encoder), proves it was not applied; anything else leaves its
// outcome unknown (a bare context error too: pgx's stdlib returns one for a
// statement it sent).
func writeError(db Querier, op, msg string, err error) error {
	if _, inTx := db.(*sql.Tx); inTx {
		return prefixed(msg, translate(err))
	}
	if sqlguard.ArgumentRefused(err) || pgcore.EncodeRefused(err) {
		return prefixed(msg+": not sent", err)
	}
	if known, ok := notApplied(msg, err); ok {
		return known
	}
	return &fence.OutcomeUnknownError{Op: op, Err: prefixed(msg, err)}
}
