package history

import (
	"strconv"
	"testing"
	"time"
)

// controlRuns is how many seeds each negative control runs.
const controlRuns = 5

// controlDuration is the length of one control run: the budget shared by
// the runs, and at least two seconds.
func controlDuration(b Budget) time.Duration { return max(b.Duration/controlRuns, 2*time.Second) }

// rejectsMost asserts that reject, run with controlRuns seeds, reports a
// rejection in most of them.
func rejectsMost(t *testing.T, name string, reject func(t *testing.T, b Budget) bool) {
	b := BudgetFor(t)
	b.Duration = controlDuration(b)
	rejected := 0
	for i := range controlRuns {
		run := Budget{Duration: b.Duration, Seed: b.Seed + uint64(i)}
		t.Run(strconv.FormatUint(run.Seed, 10), func(t *testing.T) {
			if reject(t, run) {
				rejected++
			}
		})
	}
	t.Logf("%s: the checker rejected %d of %d runs of %v (seeds %d to %d)", name, rejected, controlRuns, b.Duration, b.Seed, b.Seed+controlRuns-1)
	if 2*rejected <= controlRuns {
		t.Fatalf("%s: the checker rejected only %d of %d runs of a broken variant; it must reject most", name, rejected, controlRuns)
	}
}
