package rueidisfence

import (
	"context"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/internal/harness/workload"
	"github.com/fencekit/fencekit/lock"
	fkredis "github.com/fencekit/fencekit/storage/redis"
)

// TestLostUpdates runs the lost-update workload (acquire, read, sometimes
// pause past the lease, write, release) on Lockers of the rueidis client,
// with counters in a fenced Redis store on the same client: fenced, no
// acknowledged increment is lost and admitted tokens never go down; with
// the plain lock alone (the negative control), the paused holders' late
// writes lose some.
func TestLostUpdates(t *testing.T) {
	prefix := testenv.Prefix(t)
	rc := rueidisClient(t, sharedAddr(t))
	l, err := New(rc, lock.WithPrefix(prefix+"lock:"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c := testenv.Redis(t) // the negative control's plain GET and SET
	st, err := NewStore(rc, fkredis.WithPrefix(prefix+"store-data:"))
	if err != nil {
		t.Fatal(err)
	}
	counter := &workload.RedisCounter{Client: c, Store: st, PlainPrefix: prefix + "plain:"}
	run := func(mode workload.Mode) workload.Result {
		var res workload.Result
		// Longer on a loaded machine, until the run has judged enough.
		for range 4 {
			r, err := workload.Run(context.Background(), workload.Config{
				Locker: l, Counter: counter, Mode: mode,
				Resources: []string{"acct-" + mode.String() + "-1", "acct-" + mode.String() + "-2"},
				Duration:  time.Second,
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Log(r)
			res = r
			if mode == workload.Fenced && r.Acked >= 20 && r.Stale > 0 || mode == workload.Plain && r.Lost > 0 {
				break
			}
		}
		return res
	}
	fenced := run(workload.Fenced)
	if !fenced.Safe() {
		t.Errorf("fenced run on the rueidis client lost updates: %v", fenced)
	}
	if fenced.Acked < 20 || fenced.Stale == 0 {
		t.Errorf("fenced run judged too little (acked %d, stale %d)", fenced.Acked, fenced.Stale)
	}
	plain := run(workload.Plain)
	if plain.Lost == 0 {
		t.Errorf("negative control: the plain run lost nothing, so the workload could not show a loss: %v", plain)
	}
}
