package mysql

import (
	"database/sql"
	"fmt"
	"testing"

	"github.com/fencekit/fencekit/fence"
)

// TestAdmittedIsBoundedAndPerHandle: the memory of admitted fences holds
// a fence for its handle and resource only, forgets it on demand, and
// never keeps more than maxAdmitted resources.
func TestAdmittedIsBoundedAndPerHandle(t *testing.T) {
	var a admittedFences
	db1, db2 := new(sql.DB), new(sql.DB)
	f := fence.Fence{Resource: "r", Token: 5, Holder: "a"}
	a.remember(db1, f)
	switch {
	case !a.holds(db1, f):
		t.Fatal("the fence remembered is not held")
	case a.holds(db2, f):
		t.Fatal("another handle holds the fence")
	case a.holds(db1, fence.Fence{Resource: "r", Token: 5, Holder: "b"}), a.holds(db1, fence.Fence{Resource: "r", Token: 6, Holder: "a"}):
		t.Fatal("another fence of the resource is held")
	}
	a.forget(db1, "r")
	if a.holds(db1, f) {
		t.Fatal("a forgotten fence is held")
	}
	for i := range 3 * maxAdmitted {
		a.remember(db1, fence.Fence{Resource: fmt.Sprint("r", i), Token: 1, Holder: "a"})
		if n := len(a.m); n > maxAdmitted {
			t.Fatalf("%d resources remembered, more than %d", n, maxAdmitted)
		}
	}
	last := fence.Fence{Resource: fmt.Sprint("r", 3*maxAdmitted-1), Token: 1, Holder: "a"}
	if !a.holds(db1, last) {
		t.Fatal("the last fence remembered is not held")
	}
}
