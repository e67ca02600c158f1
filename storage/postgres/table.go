package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

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
// [Table.UpdateVersion]. Names are only ever quoted as identifiers, so any
// string without a NUL byte is safe as a name. A Table is a plain value, safe
// to share.
//
// Key, Token, Holder and Version, after defaults, must name four different
// columns, and no [Assignment] may name any of them: otherwise a fenced write
// could put the token into the key, or UpdateVersion bump it. Every method
// refuses such a Table, and names holding NUL bytes (which quoting would
// silently drop, turning one name into another), with [fence.ErrInvalid]
// before sending anything. So is a NULL key (nil, a nil pointer, a
// driver.Valuer that yields nil such as an invalid sql.Null* or a pgtype
// value that is not Valid): NULL equals no key, and a nullable unique key
// column holds any number of NULLs, so an Upsert would insert a new row
// under any fence, a stale one included.
//
// A row's own mark and the guard table's marks ([Guard], [InTx], [Exec],
// [Query]) know nothing of each other: a write fenced by one is not checked
// against marks in the other, even for the same resource and token. Fence
// every write to a piece of data the same way. Likewise, fenced writes do
// not bump the version column, so [Table.UpdateVersion] does not notice
// them.
//
// A fenced write to a table that lacks the token or holder column returns
// an error naming the missing columns and the ALTER TABLE that adds them
// (wrapping the server's *pgconn.PgError, SQLSTATE 42703).
//
// On a pool or a connection each write commits by itself. A write whose
// reply is cut off (its ctx ends or its connection breaks after it was
// sent) returns an error matching [fence.ErrOutcomeUnknown]: it may have
// been applied (see "When the outcome is unknown" in the package doc).
type Table struct {
	// Name is the table, optionally schema-qualified: pgx.Identifier{"t"} or
	// pgx.Identifier{"s", "t"}. Required.
	Name pgx.Identifier
	// Key is the column that identifies a row; it must be unique (a primary
	// key or unique constraint, which Upsert's ON CONFLICT needs). Required.
	Key string
	// Token is the bigint column holding the row's high-water token
	// (NULL counts as no mark). default: "fence_token"
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

// table holds the quoted names of a validated Table, and the token and
// holder columns' own names for messages.
type table struct {
	name, key, token, holder, version string
	display                           string
	tokenCol, holderCol, versionCol   string
}

// resolve validates t and values before anything is sent: every name is
// non-empty and free of NUL bytes (which pgx.Identifier.Sanitize would drop,
// making "a\x00b" name column "ab"); key, token, holder and version, after
// defaults, are four different columns; and each value names another column,
// once. Columns are told apart as PostgreSQL keeps their names: cut to 63
// bytes, so two names that differ only after that are one column.
func (t Table) resolve(values []Assignment) (table, error) {
	display := strings.Join(t.Name, ".")
	if len(t.Name) == 0 || len(t.Name) > 2 {
		return table{}, invalid("table name needs one or two parts, got %d", len(t.Name))
	}
	for _, p := range t.Name {
		if err := checkIdent(display, "table name part", p); err != nil {
			return table{}, err
		}
	}
	c := sqlguard.Columns{
		Key:     t.Key,
		Token:   orDefault(t.Token, DefaultTokenColumn),
		Holder:  orDefault(t.Holder, DefaultHolderColumn),
		Version: orDefault(t.Version, DefaultVersionColumn),
	}
	err := store.CheckColumns(display, c, valueColumns(values), sqlguard.Dialect{
		Check: func(what, name string) error { return checkIdent(display, what, name) },
		Kept:  keptName,
		Clash: func(first, second, name string) error {
			return invalid("table %q: %s and %s columns are both %q (as PostgreSQL keeps the name); they must differ", display, first, second, keptName(name))
		},
	})
	if err != nil {
		return table{}, err
	}
	return table{
		name:       t.Name.Sanitize(),
		key:        pgx.Identifier{c.Key}.Sanitize(),
		token:      pgx.Identifier{c.Token}.Sanitize(),
		holder:     pgx.Identifier{c.Holder}.Sanitize(),
		version:    pgx.Identifier{c.Version}.Sanitize(),
		display:    display,
		tokenCol:   c.Token,
		holderCol:  c.Holder,
		versionCol: c.Version,
	}, nil
}

// keptName is the name PostgreSQL keeps for identifier s (cut to 63 bytes).
func keptName(s string) string { return pgcore.KeptName(s) }

// checkIdent refuses an empty name or one holding a NUL byte.
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

// admitRowSQL is the admission rule on a row's own columns, for $2 (token)
// and $3 (holder); a NULL token is no mark.
func admitRowSQL(tokenCol, holderCol string) string { return pgcore.AdmitRowSQL(tokenCol, holderCol) }

// Update writes values to the row whose key column equals key, if the row's
// own mark admits f ([fence.Admits]), and sets the mark to (f.Token,
// f.Holder) in the same statement. With no values it only raises the mark:
// inside a transaction that is the fenced read of a row, after which the
// row is locked until the transaction ends.
//
// A refused f returns an error wrapping a [*fence.StaleError] carrying the row's mark as read
// right after the refusal (its Resource is f.Resource); a missing row returns
// an error matching [fence.ErrNotFound]. Either way nothing changed. Telling
// them apart takes a second statement, only when no row was updated. ctx
// bounds the statements.
func (t Table) Update(ctx context.Context, db Querier, f fence.Fence, key any, values ...Assignment) error {
	ctx, span := startSpan(ctx, "fencekit.postgres.table_update", &f)
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
	st, err := t.statement(stmtUpdate, values, updateSQL)
	if err != nil {
		return err
	}
	r := st.table
	if err := store.CheckKey("Table.Update", r.display, key); err != nil {
		return err
	}
	args := make([]any, 0, len(values)+3)
	args = append(args, key, int64(f.Token), f.Holder)
	for _, v := range values {
		args = append(args, v.Value)
	}
	commits := commitsItself(db)
	return onConn(ctx, db, func(db Querier) error {
		tag, err := db.Exec(ctx, st.sql, args...)
		if err != nil {
			err = prefixed(fmt.Sprintf("postgres: fenced update of %q", r.display), r.markColumns(ctx, db, translate(err, f)))
			if commits {
				return unknownOutcome("postgres: Table.Update", err)
			}
			return err
		}
		if tag.RowsAffected() > 0 {
			return nil
		}
		return r.refusal(ctx, db, f, key)
	})
}

// updateSQL is Table.Update's statement for r and the columns of values:
// the key is $1, the fence $2 and $3, the values $4 on.
func updateSQL(r table, values []Assignment) string {
	var sb strings.Builder
	sb.WriteString("UPDATE " + r.name + " SET ")
	for i, v := range values {
		sb.WriteString(pgx.Identifier{v.Column}.Sanitize() + " = $" + strconv.Itoa(i+4) + ", ")
	}
	sb.WriteString(r.token + " = $2, " + r.holder + " = $3 WHERE " + r.key + " = $1 AND " + admitRowSQL(r.token, r.holder))
	return sb.String()
}

// Upsert inserts the row (key, values) with mark (f.Token, f.Holder), or, if
// a row with that key exists, updates it as [Table.Update] does: only if its
// mark admits f. A refused f returns an error wrapping a [*fence.StaleError] carrying the
// row's mark, and nothing changed. ctx bounds the statements.
func (t Table) Upsert(ctx context.Context, db Querier, f fence.Fence, key any, values ...Assignment) error {
	ctx, span := startSpan(ctx, "fencekit.postgres.table_upsert", &f)
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
	st, err := t.statement(stmtUpsert, values, upsertSQL)
	if err != nil {
		return err
	}
	r := st.table
	if err := store.CheckKey("Table.Upsert", r.display, key); err != nil {
		return err
	}
	args := make([]any, 0, len(values)+3)
	args = append(args, key, int64(f.Token), f.Holder)
	for _, v := range values {
		args = append(args, v.Value)
	}
	commits := commitsItself(db)
	return onConn(ctx, db, func(db Querier) error {
		tag, err := db.Exec(ctx, st.sql, args...)
		if err != nil {
			err = prefixed(fmt.Sprintf("postgres: fenced upsert into %q", r.display), r.markColumns(ctx, db, translate(err, f)))
			if commits {
				return unknownOutcome("postgres: Table.Upsert", err)
			}
			return err
		}
		if tag.RowsAffected() > 0 {
			return nil
		}
		return r.refusal(ctx, db, f, key)
	})
}

// upsertSQL is Table.Upsert's statement for r and the columns of values:
// the key is $1, the fence $2 and $3, the values $4 on.
func upsertSQL(r table, values []Assignment) string {
	cols := []string{r.key, r.token, r.holder}
	params := []string{"$1", "$2", "$3"}
	for i, v := range values {
		cols = append(cols, pgx.Identifier{v.Column}.Sanitize())
		params = append(params, "$"+strconv.Itoa(i+4))
	}
	sets := make([]string, 0, len(cols)-1)
	for _, c := range cols[1:] {
		sets = append(sets, c+" = EXCLUDED."+c)
	}
	// The alias keeps the admission about the existing row; the parameters
	// are the incoming fence.
	return "INSERT INTO " + r.name + " AS cur (" + strings.Join(cols, ", ") + ") VALUES (" + strings.Join(params, ", ") +
		") ON CONFLICT (" + r.key + ") DO UPDATE SET " + strings.Join(sets, ", ") +
		" WHERE " + admitRowSQL("cur."+r.token, "cur."+r.holder)
}

// missingColumnsSQL returns which of the columns $2 the table $1 lacks.
const missingColumnsSQL = pgcore.MissingColumnsSQL

// markColumns turns the server's error for a missing token or holder column
// (SQLSTATE 42703) into one that names the missing columns and the statement
// that adds them; other errors come back as they are. On a pool or a
// connection it asks the catalog which of the two are missing; in a
// transaction, which the failed statement aborted, it names the column the
// server named and adds both, each only if missing.
func (r table) markColumns(ctx context.Context, db Querier, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != codeUndefinedColumn {
		return err
	}
	cols := []string{r.tokenCol, r.holderCol}
	types := map[string]string{r.tokenCol: "bigint", r.holderCol: "text"}
	missing := pgcore.NamedColumns(pgErr.Message, cols...)
	if len(missing) == 0 {
		return err // a column of the caller's
	}
	add := cols
	if _, inTx := db.(pgx.Tx); !inTx {
		var absent []string
		if qerr := db.QueryRow(ctx, missingColumnsSQL, r.name, cols).Scan(&absent); qerr == nil && len(absent) > 0 {
			missing, add = absent, absent
		}
	}
	return fmt.Errorf("%s: %w", pgcore.MarkColumnsHint(r.display, r.name, missing, add, types), err)
}

// versionColumn turns the server's error for a missing version column
// (SQLSTATE 42703) into one that gives the ALTER TABLE that adds it; other
// errors come back as they are.
func (r table) versionColumn(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != codeUndefinedColumn || len(pgcore.NamedColumns(pgErr.Message, r.versionCol)) == 0 {
		return err
	}
	return fmt.Errorf("%s: %w", pgcore.VersionColumnHint(r.display, r.name, r.versionCol), err)
}

// refusal tells a stale fence from a missing row after a fenced write
// touched no row.
func (r table) refusal(ctx context.Context, db Querier, f fence.Fence, key any) error {
	var token *int64
	var holder *string
	err := db.QueryRow(ctx, "SELECT "+r.token+", "+r.holder+" FROM "+r.name+" WHERE "+r.key+" = $1", key).Scan(&token, &holder)
	if errors.Is(err, pgx.ErrNoRows) {
		return prefixed(fmt.Sprintf("postgres: %q key %v", r.display, key), fence.ErrNotFound)
	}
	if err != nil {
		return prefixed(fmt.Sprintf("postgres: mark of %q key %v", r.display, key), translate(err, f))
	}
	mark := fence.Fence{Resource: f.Resource}
	if token != nil {
		mark.Token = fence.Token(*token)
	}
	if holder != nil {
		mark.Holder = *holder
	}
	return prefixed(fmt.Sprintf("postgres: %q key %v", r.display, key), &fence.StaleError{Fence: f, HighWater: mark})
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
	ctx, span := startSpan(ctx, "fencekit.postgres.table_update_version", nil)
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
		sb.WriteString(pgx.Identifier{v.Column}.Sanitize() + " = $" + strconv.Itoa(len(args)) + ", ")
	}
	sb.WriteString(r.version + " = " + r.version + " + 1 WHERE " + r.key + " = $1 AND " + r.version + " = $2 RETURNING " + r.version)
	commits := commitsItself(db)
	var next int64
	err = onConn(ctx, db, func(db Querier) error {
		var err error
		next, err = r.updateVersion(ctx, db, sb.String(), args, key, version, commits)
		return err
	})
	return next, err
}

func (r table) updateVersion(ctx context.Context, db Querier, sql string, args []any, key any, version int64, commits bool) (int64, error) {
	var next int64
	err := db.QueryRow(ctx, sql, args...).Scan(&next)
	if err == nil {
		return next, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		err = prefixed(fmt.Sprintf("postgres: versioned update of %q", r.display), r.versionColumn(translate(err, fence.Fence{})))
		if commits {
			return 0, unknownOutcome("postgres: Table.UpdateVersion", err)
		}
		return 0, err
	}
	var actual *int64
	err = db.QueryRow(ctx, "SELECT "+r.version+" FROM "+r.name+" WHERE "+r.key+" = $1", key).Scan(&actual)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, prefixed(fmt.Sprintf("postgres: %q key %v", r.display, key), fence.ErrNotFound)
	case err != nil:
		return 0, prefixed(fmt.Sprintf("postgres: version of %q key %v", r.display, key), translate(err, fence.Fence{}))
	case actual == nil:
		return 0, prefixed(fmt.Sprintf("postgres: %q key %v", r.display, key), ErrNullVersion)
	}
	return 0, &fence.ConflictError{Key: fmt.Sprintf("%s[%v]", r.display, key), Expected: version, Actual: *actual}
}
