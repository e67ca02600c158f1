package postgres

import (
	"sync"
	"sync/atomic"
)

// A Table method checks its Table and the columns of its values, and
// writes its statement, on every call: on loopback that costs a fenced
// write a few percent of its time, about what the server spends on the
// row's mark. So the checked names and the statement are kept per Table,
// operation and value columns. Only a call whose names passed the checks
// is kept: a refused one is checked again, and refused again, each time.
//
// The kept statements are a map that is never changed once published:
// keeping one more copies it. A lookup is then one atomic load and a map
// lookup with the key's own hash, without a lock and without boxing the
// key (a sync.Map boxed it, an allocation, and hashed it through its type
// descriptor: about a third of Table.Update's own time on the client).
// Copies are bounded by maxStatements.

// Operations whose statements are kept.
const (
	stmtUpdate = iota + 1
	stmtUpsert
)

// stmtKeyCols is the most value columns a kept statement has; a call with
// more builds its statement each time.
const stmtKeyCols = 4

// maxStatements bounds the statements kept, for a program that writes to
// tables or column sets without end; past it, statements are built each
// time.
const maxStatements = 1024

// stmtKey is what a statement is written from: the Table as given (before
// defaults, so that no check runs before the lookup) and the value columns.
type stmtKey struct {
	op                          int
	name                        [2]string
	parts                       int
	key, token, holder, version string
	cols                        [stmtKeyCols]string
	ncols                       int
}

// stmt is a kept statement and the checked names it was written from.
type stmt struct {
	table table
	sql   string
}

var (
	statements     atomic.Pointer[map[stmtKey]*stmt] // never changed once stored
	statementsMu   sync.Mutex                        // serialises keeping
	statementsKept int                               // under statementsMu
)

// keptStatement returns the statement kept for k, if any.
func keptStatement(k stmtKey) (*stmt, bool) {
	m := statements.Load()
	if m == nil {
		return nil, false
	}
	st, ok := (*m)[k]
	return st, ok
}

// keepStatement keeps st for k unless a statement is kept for k already
// or maxStatements are.
func keepStatement(k stmtKey, st *stmt) {
	statementsMu.Lock()
	defer statementsMu.Unlock()
	old := statements.Load()
	if statementsKept >= maxStatements {
		return
	}
	if old != nil {
		if _, ok := (*old)[k]; ok {
			return
		}
	}
	m := make(map[stmtKey]*stmt, statementsKept+1)
	if old != nil {
		for k, v := range *old {
			m[k] = v
		}
	}
	m[k] = st
	statements.Store(&m)
	statementsKept++
}

// statement returns op's statement for t and the columns of values, written
// by build from t's checked names, or the error of the checks.
func (t Table) statement(op int, values []Assignment, build func(table, []Assignment) string) (*stmt, error) {
	k, ok := t.stmtKey(op, values)
	if ok {
		if st, found := keptStatement(k); found {
			return st, nil
		}
	}
	r, err := t.resolve(values)
	if err != nil {
		return nil, err
	}
	st := &stmt{table: r, sql: build(r, values)}
	if ok {
		keepStatement(k, st)
	}
	return st, nil
}

// stmtKey returns the key of op's statement for t and values, or false
// when such a statement is not kept.
func (t Table) stmtKey(op int, values []Assignment) (stmtKey, bool) {
	if len(t.Name) == 0 || len(t.Name) > 2 || len(values) > stmtKeyCols {
		return stmtKey{}, false
	}
	k := stmtKey{op: op, parts: len(t.Name), key: t.Key, token: t.Token, holder: t.Holder, version: t.Version, ncols: len(values)}
	copy(k.name[:], t.Name)
	for i, v := range values {
		k.cols[i] = v.Column
	}
	return k, true
}
