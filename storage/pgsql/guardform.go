package pgsql

import (
	"context"
	"database/sql"
	"reflect"
	"runtime"
	"sync"
	"weak"

	"github.com/jackc/pgx/v5"
)

// guardForm is the statement InTx and Once send as their guard on a
// driver: the cheapest of those that take one round trip there.
type guardForm int

const (
	// guardArgs: pgcore.GuardAdmitSQL with arguments, the function's call:
	// for pgx's stdlib when it plans each statement anyway (simple
	// protocol, or exec modes without its statement cache), where the plain
	// call is the least to plan, and for every other driver. lib/pq sends
	// it, as any statement with arguments, in two round trips unless its
	// connection string says binary_parameters=yes; the arguments are never
	// written into the statement's text.
	guardArgs guardForm = iota
	// guardLocked: pgcore.GuardAdmitLockedSQL, for pgx's stdlib with its
	// statement cache (its default), which prepares the statement once per
	// connection: the fence that holds the mark is admitted without calling
	// the function.
	guardLocked
)

// guardForms keeps the form found for each *sql.DB on pgx's stdlib, for as
// long as the *sql.DB lives.
var guardForms sync.Map // weak.Pointer[sql.DB] -> guardForm

// guardFormOf returns the guard's form on db. On pgx's stdlib the first
// call for db reads the exec mode of one of its connections.
func guardFormOf(ctx context.Context, db *sql.DB) guardForm {
	if !pgxStdlib(db) {
		return guardArgs
	}
	k := weak.Make(db)
	if v, ok := guardForms.Load(k); ok {
		return v.(guardForm)
	}
	form, ok := probeGuardForm(ctx, db)
	if !ok {
		return guardArgs // one round trip in every mode; found again next time
	}
	if _, loaded := guardForms.LoadOrStore(k, form); !loaded {
		runtime.AddCleanup(db, func(k weak.Pointer[sql.DB]) { guardForms.Delete(k) }, k)
	}
	return form
}

// probeGuardForm reads the exec mode of a connection of db, a pool of
// pgx's stdlib; false when it could not.
func probeGuardForm(ctx context.Context, db *sql.DB) (guardForm, bool) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return 0, false
	}
	defer conn.Close()
	form, known := guardArgs, false
	err = conn.Raw(func(dc any) error {
		if c, ok := dc.(interface{ Conn() *pgx.Conn }); ok {
			known = true
			if c.Conn().Config().DefaultQueryExecMode == pgx.QueryExecModeCacheStatement {
				form = guardLocked
			}
		}
		return nil
	})
	return form, err == nil && known
}

// pgxStdlib reports whether db runs on pgx's stdlib driver, whose COMMIT
// (like every statement of a transaction begun with a context) stops
// waiting when that context ends. The driver is recognised by its
// package, so that this package does not import it (and register it as a
// database/sql driver) for users of another driver.
func pgxStdlib(db *sql.DB) bool {
	t := reflect.TypeOf(db.Driver())
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t != nil && t.PkgPath() == "github.com/jackc/pgx/v5/stdlib"
}
