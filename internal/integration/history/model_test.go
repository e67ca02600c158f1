package history

import (
	"math"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// op is one call of a hand-written history: client, input, output, and
// its invocation and return times (ret < 0: left open).
func op(client int, in, out any, call, ret int64) porcupine.Operation {
	if ret < 0 {
		ret = math.MaxInt64
	}
	return porcupine.Operation{ClientId: client, Input: in, Output: out, Call: call, Return: ret}
}

var (
	f1 = Mark{Token: 1, Holder: "a"}
	f2 = Mark{Token: 2, Holder: "b"}
	f3 = Mark{Token: 3, Holder: "c"}
)

// TestRedisModel checks the model on histories small enough to judge by
// hand, each legal or not.
func TestRedisModel(t *testing.T) {
	get := func(f Mark) RedisIn { return RedisIn{Key: "k", Op: OpGet, Fence: f} }
	set := func(f Mark, d string) RedisIn { return RedisIn{Key: "k", Op: OpSet, Fence: f, Data: d} }
	load := RedisIn{Key: "k", Op: OpLoad}
	cas := func(exp int64, d string) RedisIn { return RedisIn{Key: "k", Op: OpCAS, Expected: exp, Data: d} }
	casTTL := func(exp int64, d string) RedisIn {
		in := cas(exp, d)
		in.TTL = 10 * time.Millisecond
		return in
	}
	const ms = int64(time.Millisecond)
	ok := func(d string, v int64) RedisOut { return RedisOut{Status: Ok, Data: d, Version: v} }
	stale := func(m Mark) RedisOut { return RedisOut{Status: Stale, Mark: m} }
	open := RedisOut{Status: Unknown}
	cases := []struct {
		name  string
		ops   []porcupine.Operation
		legal bool
	}{
		{"fenced write then reads", []porcupine.Operation{
			op(0, set(f1, "x"), ok("", 1), 0, 1),
			op(1, get(f1), ok("x", 1), 2, 3),
			op(2, load, ok("x", 1), 4, 5),
		}, true},
		{"an older fence is refused with the newer mark", []porcupine.Operation{
			op(0, get(f2), RedisOut{Status: NotFound}, 0, 1),
			op(1, set(f1, "x"), stale(f2), 2, 3),
			op(2, load, RedisOut{Status: NotFound}, 4, 5),
		}, true},
		{"an older fence admitted after a newer one", []porcupine.Operation{
			op(0, get(f2), RedisOut{Status: NotFound}, 0, 1),
			op(1, set(f1, "x"), ok("", 1), 2, 3),
		}, false},
		{"a refused write that changed the value", []porcupine.Operation{
			op(0, get(f2), RedisOut{Status: NotFound}, 0, 1),
			op(1, set(f1, "x"), stale(f2), 2, 3),
			op(2, load, ok("x", 1), 4, 5),
		}, false},
		{"a refused read whose fence became the mark", []porcupine.Operation{
			op(0, get(f2), stale(f3), 0, 10),
			op(1, set(f1, "x"), stale(f2), 2, 3),
			op(2, set(f3, "y"), ok("", 1), 5, 6),
		}, false},
		{"a refused read, the mark it lost to newer", []porcupine.Operation{
			op(0, get(f2), stale(f3), 0, 10),
			op(1, set(f1, "x"), stale(f3), 2, 7),
			op(2, set(f3, "y"), ok("", 1), 5, 6),
		}, true},
		{"a write applied twice", []porcupine.Operation{
			op(0, cas(0, "x"), ok("", 1), 0, 1),
			op(1, load, ok("x", 2), 2, 3),
		}, false},
		{"a conflict reported for a write that applied", []porcupine.Operation{
			op(0, cas(0, "x"), RedisOut{Status: Conflict, Version: 1}, 0, 1),
			op(1, load, ok("x", 1), 2, 3),
		}, false},
		{"an open write may have applied", []porcupine.Operation{
			op(0, cas(0, "x"), open, 0, -1),
			op(1, load, ok("x", 1), 2, 3),
		}, true},
		{"an open write may not have applied", []porcupine.Operation{
			op(0, cas(0, "x"), open, 0, -1),
			op(1, load, RedisOut{Status: NotFound}, 2, 3),
		}, true},
		{"an open write applies once", []porcupine.Operation{
			op(0, cas(0, "x"), open, 0, -1),
			op(1, load, ok("x", 1), 2, 3),
			op(1, load, RedisOut{Status: NotFound, Version: 0}, 4, 5),
		}, false},
		{"a conflict without its version", []porcupine.Operation{
			op(0, cas(0, "x"), ok("", 1), 0, 1),
			op(1, cas(0, "y"), RedisOut{Status: Conflict, Version: -1}, 2, 3),
		}, true},
		// Values that expire: a TTL of 10 ms, times in ms.
		{"an expired value reads as missing at the next version", []porcupine.Operation{
			op(0, casTTL(0, "x"), ok("", 1), 0, 1*ms),
			op(1, load, ok("x", 1), 2*ms, 3*ms),
			op(1, load, RedisOut{Status: NotFound, Version: 2}, 30*ms, 31*ms),
		}, true},
		{"a value read live after it surely expired", []porcupine.Operation{
			op(0, casTTL(0, "x"), ok("", 1), 0, 1*ms),
			op(1, load, ok("x", 1), 30*ms, 31*ms),
		}, false},
		{"a read around the expiry may see the value", []porcupine.Operation{
			op(0, casTTL(0, "x"), ok("", 1), 0, 1*ms),
			op(1, load, ok("x", 1), 9*ms, 12*ms),
		}, true},
		{"a read around the expiry may see it gone", []porcupine.Operation{
			op(0, casTTL(0, "x"), ok("", 1), 0, 1*ms),
			op(1, load, RedisOut{Status: NotFound, Version: 2}, 9*ms, 12*ms),
		}, true},
		{"an expired value comes not back", []porcupine.Operation{
			op(0, casTTL(0, "x"), ok("", 1), 0, 1*ms),
			op(1, load, RedisOut{Status: NotFound, Version: 2}, 9*ms, 12*ms),
			op(1, load, ok("x", 1), 13*ms, 14*ms),
		}, false},
		{"a compare-and-set at the version before expiry is refused", []porcupine.Operation{
			op(0, casTTL(0, "x"), ok("", 1), 0, 1*ms),
			op(1, cas(1, "y"), RedisOut{Status: Conflict, Version: 2}, 30*ms, 31*ms),
		}, true},
		{"a compare-and-set at the version before expiry admitted", []porcupine.Operation{
			op(0, casTTL(0, "x"), ok("", 1), 0, 1*ms),
			op(1, cas(1, "y"), ok("", 2), 30*ms, 31*ms),
		}, false},
		{"a write without a TTL makes the value permanent", []porcupine.Operation{
			op(0, casTTL(0, "x"), ok("", 1), 0, 1*ms),
			op(0, cas(1, "y"), ok("", 2), 2*ms, 3*ms),
			op(1, load, ok("y", 2), 30*ms, 31*ms),
		}, true},
		{"an open write's value may expire late", []porcupine.Operation{
			op(0, casTTL(0, "x"), open, 0, -1),
			op(1, load, ok("x", 1), 30*ms, 31*ms),
		}, true},
		{"an expiry leaves the mark", []porcupine.Operation{
			op(0, RedisIn{Key: "k", Op: OpSet, Fence: f2, Data: "x", TTL: 10 * time.Millisecond}, ok("", 1), 0, 1*ms),
			op(1, set(f1, "y"), stale(f2), 30*ms, 31*ms),
		}, true},
	}
	model := RedisModel.ToModel()
	for _, c := range cases {
		if got := porcupine.CheckOperations(model, StampRedis(c.ops)); got != c.legal {
			t.Errorf("%s: linearizable = %v, want %v", c.name, got, c.legal)
		}
	}
}

// TestPgModel checks the PostgreSQL model the same way.
func TestPgModel(t *testing.T) {
	read := PgIn{Key: "k", Op: PgRead}
	exec := func(f Mark, d string) PgIn { return PgIn{Key: "k", Op: PgExec, Fence: f, Data: d} }
	row := func(f Mark, d string) PgIn { return PgIn{Key: "k", Op: PgRowUpd, Fence: f, Data: d} }
	rmw := func(f Mark, d string) PgIn { return PgIn{Key: "k", Op: PgTxRMW, Fence: f, Data: d} }
	once := func(f Mark, key int, d string) PgIn { return PgIn{Key: "k", Op: PgOnce, Fence: f, Once: key, Data: d} }
	okOut := PgOut{Status: Ok}
	cases := []struct {
		name  string
		ops   []porcupine.Operation
		legal bool
	}{
		{"a guarded write raises the guard mark only", []porcupine.Operation{
			op(0, exec(f1, "x"), okOut, 0, 1),
			op(1, read, PgOut{Status: Ok, Data: "x", Version: 1, Guard: f1}, 2, 3),
		}, true},
		{"guard and row marks are separate", []porcupine.Operation{
			op(0, exec(f2, "x"), okOut, 0, 1),
			op(1, row(f1, "y"), okOut, 2, 3),
			op(1, read, PgOut{Status: Ok, Data: "y", Version: 1, Guard: f2, Row: f1}, 4, 5),
		}, true},
		{"an older guarded write admitted after a newer one", []porcupine.Operation{
			op(0, exec(f2, "x"), okOut, 0, 1),
			op(1, exec(f1, "y"), okOut, 2, 3),
		}, false},
		{"a lost update", []porcupine.Operation{
			op(0, exec(f1, "x"), okOut, 0, 1),
			op(0, PgIn{Key: "k", Op: PgUV, Expected: 1, Data: "y"}, PgOut{Status: Ok, Version: 2}, 2, 3),
			op(0, rmw(f1, "z"), PgOut{Status: Ok, Data: "x", Version: 1}, 4, 5),
		}, false},
		{"an aborted write changes nothing", []porcupine.Operation{
			op(0, exec(f1, "x"), PgOut{Status: Aborted}, 0, 1),
			op(1, read, PgOut{Status: Ok}, 2, 3),
		}, true},
		{"an aborted write that applied", []porcupine.Operation{
			op(0, exec(f1, "x"), PgOut{Status: Aborted}, 0, 1),
			op(1, read, PgOut{Status: Ok, Data: "x", Version: 1, Guard: f1}, 2, 3),
		}, false},
		{"a Once refused by the server before its work ran", []porcupine.Operation{
			op(0, once(f1, 1, "x"), PgOut{Status: Failed}, 0, 1),
			op(1, once(f1, 1, "y"), PgOut{Status: Ok, Ran: true}, 2, 3),
		}, true},
		{"a Once on a done key fails instead of reporting done", []porcupine.Operation{
			op(0, once(f1, 1, "x"), PgOut{Status: Ok, Ran: true}, 0, 1),
			op(1, once(f1, 1, "y"), PgOut{Status: Failed}, 2, 3),
		}, false},
	}
	model := PgModel.ToModel()
	for _, c := range cases {
		if got := porcupine.CheckOperations(model, c.ops); got != c.legal {
			t.Errorf("%s: linearizable = %v, want %v", c.name, got, c.legal)
		}
	}
}
