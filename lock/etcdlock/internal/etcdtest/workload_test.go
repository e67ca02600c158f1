package etcdtest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/internal/harness/workload"
	"github.com/fencekit/fencekit/migrations"
)

// TestWorkloadLeaderRestart runs the shared lost-update workload (acquire,
// fenced read, pauses past the lease, fenced write) with etcd Lockers and
// the PostgreSQL guard while the etcd leader member is stopped and
// restarted midway: the fenced run loses nothing, refuses stale holders and
// goes on after the fault, and the plain run beside it (the negative
// control, same cluster, same faults) loses increments.
func TestWorkloadLeaderRestart(t *testing.T) {
	c := StartCluster(t, 3)
	pool := testenv.Postgres(t)
	if err := migrations.UpPool(ctxFor(t, 30*time.Second), pool); err != nil {
		t.Fatal(err)
	}
	// The counters' table is made before the two runs start at once.
	if err := (&workload.PostgresCounter{Pool: pool}).Setup(ctxFor(t, 30*time.Second), workload.Fenced, nil); err != nil {
		t.Fatal(err)
	}
	fault := func(ctx context.Context) {
		select {
		case <-ctx.Done():
			return
		case <-time.After(2 * time.Second):
		}
		leader := c.Leader(t)
		c.Stop(leader)
		time.Sleep(2 * time.Second)
		start := time.Now()
		c.Restart(t, leader)
		t.Logf("the leader member (m%d) was stopped for 2s; its restart took %v", leader, time.Since(start).Round(time.Millisecond))
	}
	var fenced, plain workload.Result
	var wg sync.WaitGroup
	for _, mode := range []workload.Mode{workload.Fenced, workload.Plain} {
		wg.Go(func() {
			cfg := workload.Config{
				Locker:    newLocker(t, c),
				Counter:   &workload.PostgresCounter{Pool: pool},
				Mode:      mode,
				Resources: []string{"wl-" + mode.String() + "-a", "wl-" + mode.String() + "-b"},
				TTL:       2 * time.Second,
				// Long enough for work after the restarted member is
				// back, which takes seconds on a loaded machine.
				Duration: 24 * time.Second,
			}
			if mode == workload.Fenced {
				cfg.Fault = fault
			}
			res, err := workload.Run(context.Background(), cfg)
			if err != nil {
				t.Error(err)
				return
			}
			t.Log(res)
			if mode == workload.Fenced {
				fenced = res
			} else {
				plain = res
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if !fenced.Safe() {
		t.Errorf("fenced run on etcd lost updates: %v", fenced)
	}
	if fenced.Acked < 10 || fenced.Stale == 0 || fenced.AckedAfterFault == 0 {
		t.Errorf("fenced run judged too little (acked %d, stale %d, acked after the fault %d)", fenced.Acked, fenced.Stale, fenced.AckedAfterFault)
	}
	if plain.Lost == 0 {
		t.Errorf("negative control: the plain run lost nothing, so the workload could not show a loss: %v", plain)
	}
}
