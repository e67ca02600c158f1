package mysql

import (
	"database/sql"
	"sync"
	"weak"

	"github.com/fencekit/fencekit/fence"
)

// maxAdmitted bounds the resources whose last admitted fence admitted
// keeps; past it, the memory starts again empty.
const maxAdmitted = 1024

// admitted is, per database handle and resource, the fence this process
// saw admitted last by [InTx] or [Once] (a weak pointer names the handle,
// so a closed one is not kept alive). It only chooses the statement that
// admits the next fence: a fence equal to the one remembered is judged by
// followSQL, any other by admitSQL. Both judge the row they lock, so a memory that is
// wrong (another process raised the mark, the row was reset, another
// database has the same resource) costs at most a statement more, never a
// wrong admission.
var admitted admittedFences

type admittedFence struct {
	token  fence.Token
	holder string
}

type admittedKey struct {
	db       weak.Pointer[sql.DB]
	resource string
}

type admittedFences struct {
	mu sync.Mutex
	m  map[admittedKey]admittedFence
}

// holds reports whether f is the fence remembered for its resource.
func (a *admittedFences) holds(db *sql.DB, f fence.Fence) bool {
	k := admittedKey{weak.Make(db), f.Resource}
	a.mu.Lock()
	last, ok := a.m[k]
	a.mu.Unlock()
	return ok && last.token == f.Token && last.holder == f.Holder
}

// remember keeps f as its resource's last admitted fence.
func (a *admittedFences) remember(db *sql.DB, f fence.Fence) {
	k := admittedKey{weak.Make(db), f.Resource}
	a.mu.Lock()
	defer a.mu.Unlock()
	last, ok := a.m[k]
	if ok && last.token == f.Token && last.holder == f.Holder {
		return
	}
	if a.m == nil || !ok && len(a.m) >= maxAdmitted {
		a.m = make(map[admittedKey]admittedFence)
	}
	a.m[k] = admittedFence{token: f.Token, holder: f.Holder}
}

// forget drops resource's fence, after a refusal or a missing row.
func (a *admittedFences) forget(db *sql.DB, resource string) {
	k := admittedKey{weak.Make(db), resource}
	a.mu.Lock()
	delete(a.m, k)
	a.mu.Unlock()
}
