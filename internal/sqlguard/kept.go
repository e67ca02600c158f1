package sqlguard

import (
	"sync"
	"sync/atomic"
)

// A Table method of the database/sql adapters checks its Table and the
// columns of its values, and writes its statement, on every call: checks
// that quote names, fill a map and build strings, about a third of what
// the library adds on the client to a fenced write. The adapters keep the
// checked names and the statement per Table, operation and value columns
// in a Statements. Only a call whose names passed the checks is kept: a
// refused one is checked again, and refused again, each time.

// KeyCols is the most value columns a kept statement has; a call with
// more builds its statement each time.
const KeyCols = 4

// maxKept bounds the statements one Statements keeps, for a program that
// writes to tables or column sets without end; past it, statements are
// built each time.
const maxKept = 1024

// StmtKey is what a statement is written from: the operation (the
// adapter's own numbering), the Table as given (before defaults, so that
// no check runs before the lookup) and the value columns.
type StmtKey struct {
	Op                                       int
	Space, Name, Key, Token, Holder, Version string
	Cols                                     [KeyCols]string
	NCols                                    int
}

// Statements keeps values (an adapter's checked names and statement) by
// StmtKey. The kept values are a map that is never changed once
// published: keeping one more copies it, so a lookup is one atomic load
// and a map lookup, without a lock and without boxing the key. The zero
// value is ready; it must not be copied once used.
type Statements[V any] struct {
	m  atomic.Pointer[map[StmtKey]V] // never changed once stored
	mu sync.Mutex                    // serialises Keep
}

// Load returns the value kept for k, if any.
func (s *Statements[V]) Load(k StmtKey) (V, bool) {
	var zero V
	m := s.m.Load()
	if m == nil {
		return zero, false
	}
	v, ok := (*m)[k]
	return v, ok
}

// Keep keeps v for k unless a value is kept for k already or the bound is
// reached.
func (s *Statements[V]) Keep(k StmtKey, v V) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.m.Load()
	n := 0
	if old != nil {
		if _, ok := (*old)[k]; ok {
			return
		}
		n = len(*old)
	}
	if n >= maxKept {
		return
	}
	m := make(map[StmtKey]V, n+1)
	if old != nil {
		for k, v := range *old {
			m[k] = v
		}
	}
	m[k] = v
	s.m.Store(&m)
}

// Len is the number of values kept.
func (s *Statements[V]) Len() int {
	m := s.m.Load()
	if m == nil {
		return 0
	}
	return len(*m)
}

// KeyOf returns the StmtKey of op on a table (space and name as given, the
// managed columns as given) with values whose columns col returns, or
// false when there are more than KeyCols values, whose statement is not
// kept.
func KeyOf[A any](op int, space, name, key, token, holder, version string, values []A, col func(A) string) (StmtKey, bool) {
	if len(values) > KeyCols {
		return StmtKey{}, false
	}
	k := StmtKey{Op: op, Space: space, Name: name, Key: key, Token: token, Holder: holder, Version: version, NCols: len(values)}
	for i, v := range values {
		k.Cols[i] = col(v)
	}
	return k, true
}
