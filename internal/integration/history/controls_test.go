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
	rejected := 0
	for i := range n {
		run := Budget{Duration: b.Duration, Seed: b.Seed + uint64(i)}
		t.Run(strconv.FormatUint(run.Seed, 10), func(t *testing.T) {
			if reject(t, run) {
				rejected++
			}
		})
	}
	t.Logf("%s: the checker rejected %d of %d runs of %v (seeds %d to %d)", name, rejected, n, b.Duration, b.Seed, b.Seed+uint64(n)-1)
	if 2*rejected <= n {
		t.Fatalf("%s: the checker rejected only %d of %d runs of a broken variant; it must reject most", name, rejected, n)
	}
}
