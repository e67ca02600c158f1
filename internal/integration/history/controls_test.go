package history

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"
)

// controlRuns is how many seeds each negative control runs: three, or
// FENCEKIT_CONTROL_RUNS.
func controlRuns(t testing.TB) int {
	if v := os.Getenv("FENCEKIT_CONTROL_RUNS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("FENCEKIT_CONTROL_RUNS=%q: want a positive number of runs", v)
		}
		return n
	}
	return 3
}

// controlBudget is the budget that a negative control's runs share:
// FENCEKIT_CONTROL_TIME, or else the checkers' (BudgetFor).
func controlBudget(t testing.TB) Budget {
	t.Helper()
	b := BudgetFor(t)
	if v := os.Getenv("FENCEKIT_CONTROL_TIME"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("FENCEKIT_CONTROL_TIME=%q: want a positive duration such as 9s", v)
		}
		b.Duration = d
	}
	return b
}

// controlRun is what one run of a negative control found: whether the
// checker rejected its history, and how many times its broken variant went
// wrong (see minExposed).
type controlRun struct {
	rejected bool
	exposed  int64
}

// rejectsMost asserts that reject, run with controlRuns seeds, reports a
// rejection in most of them. The runs share the budget, and last at least
// three seconds each: shorter runs of the subtler variants race too seldom.
// Each run goes on past its share until its variant went wrong minExposed
// times (runContext); a run that did not, even then, counts as not rejected,
// and the failure says so, since it is the workload that fell short.
func rejectsMost(t *testing.T, name string, reject func(t *testing.T, b Budget) controlRun) {
	rejectsMostIn(t, name, 3*time.Second, reject)
}

// rejectsMostIn is rejectsMost with runs of least each: longer for a store
// whose calls are slow (the PostgreSQL guards make a few dozen a second
// under faults).
func rejectsMostIn(t *testing.T, name string, least time.Duration, reject func(t *testing.T, b Budget) controlRun) {
	if testing.Short() {
		t.Skip("negative control: runs without -short (and in .ci/checkers)")
	}
	b := controlBudget(t)
	n := controlRuns(t)
	b.Duration = max(b.Duration/time.Duration(n), least)
	// In the plain test run, the seeds stop once most of n rejected: the
	// verdict cannot change. With a budget (CI), all n run, for the rate.
	decided := func(rejected int) bool {
		return os.Getenv("FENCEKIT_CHECK_TIME") == "" && os.Getenv("FENCEKIT_CONTROL_TIME") == "" && 2*rejected > n
	}
	rejected, ran, short := 0, 0, 0
	var exposed []int64
	for ; ran < n && !decided(rejected); ran++ {
		run := Budget{Duration: b.Duration, Seed: b.Seed + uint64(ran)}
		t.Run(strconv.FormatUint(run.Seed, 10), func(t *testing.T) {
			res := reject(t, run)
			t.Logf("%s: the variant went wrong %d times; the checker %s", name, res.exposed, map[bool]string{true: "rejected the history", false: "accepted the history"}[res.rejected])
			// A run that the checker accepted decides nothing yet: the seed
			// runs again, with another schedule, up to shortTries runs in
			// all, its exposures summed, as the election models' controls
			// do. A loaded machine races less, so a run's variant may go
			// wrong once or twice; and a wrong turn need not lose a write
			// the history shows (the snapshot guard's, 3 or 4 times in a
			// run, was accepted in 1 of 3 seeds in CI).
			for try := 2; !res.rejected && try <= shortTries; try++ {
				again := run
				again.Seed += uint64(try-1) << 32
				more := reject(t, again)
				res.rejected, res.exposed = more.rejected, res.exposed+more.exposed
				t.Logf("%s: run %d of the seed: the variant went wrong %d times; the checker %s", name, try, more.exposed, map[bool]string{true: "rejected the history", false: "accepted the history"}[more.rejected])
			}
			if res.rejected {
				rejected++
			}
			if res.exposed < minExposed {
				short++
			}
			exposed = append(exposed, res.exposed)
		})
	}
	t.Logf("%s: the checker rejected %d of %d runs of %v or more (seeds %d to %d; most of %d decide); the variant went wrong %v times in them",
		name, rejected, ran, b.Duration, b.Seed, b.Seed+uint64(ran)-1, n, exposed)
	if 2*rejected <= n {
		msg := fmt.Sprintf("%s: the checker rejected only %d of %d runs of a broken variant; it must reject most", name, rejected, n)
		if short > 0 {
			msg += fmt.Sprintf(" (in %d of them the variant went wrong fewer than %d times in %v: the workload fell short)", short, minExposed, exposureCap*b.Duration)
		}
		t.Fatal(msg)
	}
}

// shortTries is how many runs a control's seed makes at most while the
// checker accepts: beside a busy loop on a 2-core machine, with one run a
// seed, six controls were rejected in 1 of 3 seeds or none, their
// variants having gone wrong once or twice a run.
const shortTries = 3

// budgetedOnly skips a negative control in the plain test run: the
// controls added with the attacking workloads run where a budget is set
// (FENCEKIT_CHECK_TIME or FENCEKIT_CONTROL_TIME, as .ci/checkers sets),
// which keeps the plain run, under -race in CI, within its time.
func budgetedOnly(t *testing.T) {
	t.Helper()
	if os.Getenv("FENCEKIT_CHECK_TIME") == "" && os.Getenv("FENCEKIT_CONTROL_TIME") == "" {
		t.Skip("negative control: runs with FENCEKIT_CHECK_TIME or FENCEKIT_CONTROL_TIME set (.ci/checkers)")
	}
}
