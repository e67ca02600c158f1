package history

import (
	"os"
	"strconv"
	"testing"
	"time"
)

// controlRuns is how many seeds each negative control runs: five when
// FENCEKIT_CHECK_TIME sets a budget (as in CI), three in the plain test run.
func controlRuns() int {
	if os.Getenv("FENCEKIT_CHECK_TIME") != "" {
		return 5
	}
	return 3
}

// rejectsMost asserts that reject, run with controlRuns seeds, reports a
// rejection in most of them. The runs share the budget, and last at least
// three seconds each: shorter runs of the subtler variants race too seldom.
func rejectsMost(t *testing.T, name string, reject func(t *testing.T, b Budget) bool) {
	if testing.Short() {
		t.Skip("negative control: runs without -short (and in .ci/checkers)")
	}
	b := BudgetFor(t)
	n := controlRuns()
	b.Duration = max(b.Duration/time.Duration(n), 3*time.Second)
	// In the plain test run, the seeds stop once most of n rejected: the
	// verdict cannot change. With a budget (CI), all n run, for the rate.
	decided := func(rejected int) bool {
		return os.Getenv("FENCEKIT_CHECK_TIME") == "" && 2*rejected > n
	}
	rejected, ran := 0, 0
	for ; ran < n && !decided(rejected); ran++ {
		run := Budget{Duration: b.Duration, Seed: b.Seed + uint64(ran)}
		t.Run(strconv.FormatUint(run.Seed, 10), func(t *testing.T) {
			if reject(t, run) {
				rejected++
			}
		})
	}
	t.Logf("%s: the checker rejected %d of %d runs of %v (seeds %d to %d; most of %d decide)", name, rejected, ran, b.Duration, b.Seed, b.Seed+uint64(ran)-1, n)
	if 2*rejected <= n {
		t.Fatalf("%s: the checker rejected only %d of %d runs of a broken variant; it must reject most", name, rejected, n)
	}
}
