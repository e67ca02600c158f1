package electionmodel

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// Budget is a run's budget: FENCEKIT_CHECK_TIME when set, def otherwise.
func Budget(t testing.TB, def time.Duration) time.Duration {
	t.Helper()
	if s := os.Getenv("FENCEKIT_CHECK_TIME"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			t.Fatalf("FENCEKIT_CHECK_TIME=%q: not a positive duration", s)
		}
		return d
	}
	return def
}

// Summary is the run's summary line: "<backend> election model judged:"
// and each kind's count, in order, then the violations and the step-down
// gaps.
func Summary(backend, what string, v *Verdict) string {
	keys := make([]string, 0, len(v.Counts))
	for k := range v.Counts {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	fmt.Fprintf(&b, "%s election model judged (%s):", backend, what)
	for i, k := range keys {
		sep := ","
		if i == 0 {
			sep = ""
		}
		fmt.Fprintf(&b, "%s %s %d", sep, k, v.Counts[k])
	}
	fmt.Fprintf(&b, "; %d violations", len(v.Violations))
	if len(v.Gaps) > 0 {
		fmt.Fprintf(&b, "; step-down gaps min %v p50 %v", pct(v.Gaps, 0), pct(v.Gaps, 50))
	}
	if len(v.LeaseGaps) > 0 {
		fmt.Fprintf(&b, "; last acts before the lease's end min %v p50 %v", pct(v.LeaseGaps, 0), pct(v.LeaseGaps, 50))
	}
	return b.String()
}

// Log logs a summary line, and appends it to the file named by
// FENCEKIT_JUDGED_LOG when that is set: CI runs the tests without -v and
// prints that file, so that every backend's judgments show.
func Log(t testing.TB, line string) {
	t.Helper()
	t.Log(line)
	name := os.Getenv("FENCEKIT_JUDGED_LOG")
	if name == "" {
		return
	}
	f, err := os.OpenFile(name, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Errorf("FENCEKIT_JUDGED_LOG: %v", err)
		return
	}
	defer f.Close()
	if _, err := fmt.Fprintf(f, "%s: %s\n", t.Name(), line); err != nil {
		t.Errorf("FENCEKIT_JUDGED_LOG: %v", err)
	}
}

func pct(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := max((p*len(s)+99)/100-1, 0)
	return s[min(i, len(s)-1)].Round(time.Millisecond)
}

// Check runs the model (run makes one run with a seed and judges it) and
// requires no violation and enough judged: a run that judged less than a
// floor (a loaded machine makes fewer terms in the budget) is followed by
// another, up to maxRuns, and the floors hold for their sum.
func Check(t *testing.T, backend string, floors map[string]int, maxRuns int, run func(seed uint64) *Verdict) {
	t.Helper()
	judged := map[string]int{}
	short := func() (kinds []string) {
		for k, least := range floors {
			if judged[k] < least {
				kinds = append(kinds, fmt.Sprintf("%s = %d, want at least %d", k, judged[k], least))
			}
		}
		slices.Sort(kinds)
		return kinds
	}
	for n := 1; ; n++ {
		seed := uint64(time.Now().UnixNano())
		v := run(seed)
		Log(t, Summary(backend, fmt.Sprintf("run %d, seed %d", n, seed), v))
		for i, s := range v.Violations {
			if i == 10 {
				t.Errorf("... %d violations in all", len(v.Violations))
				break
			}
			t.Error(s)
		}
		for k, c := range v.Counts {
			judged[k] += c
		}
		if len(short()) == 0 || n == maxRuns {
			break
		}
		t.Logf("judged too little so far (%s): another run", strings.Join(short(), ", "))
	}
	for _, s := range short() {
		t.Errorf("judged too little in %d runs: %s", maxRuns, s)
	}
}

// Rejects runs a broken variant (a control) with seeds seeds, each for up
// to tries runs until the judge reports a violation starting with kind,
// and fails t unless most seeds were rejected.
func Rejects(t *testing.T, backend, name, kind string, seeds, tries int, run func(seed uint64) *Verdict) {
	t.Helper()
	rejected, ran := 0, 0
	for s := range seeds {
		ran++
		seed := uint64(time.Now().UnixNano()) + uint64(s)
		for try := 1; try <= tries; try++ {
			v := run(seed + uint64(try)<<32)
			Log(t, Summary(backend, fmt.Sprintf("control %s, seed %d, run %d", name, seed, try), v))
			i := slices.IndexFunc(v.Violations, func(s string) bool { return strings.HasPrefix(s, kind) })
			if i >= 0 {
				t.Logf("rejected as it must be (seed %d): %s", seed, v.Violations[i])
				rejected++
				break
			}
			for _, o := range v.Violations {
				t.Logf("a violation of another kind (seed %d): %s", seed, o)
			}
		}
		// Stop once most seeds have decided, either way.
		if rejected > seeds/2 || ran-rejected > seeds/2 {
			break
		}
	}
	Log(t, fmt.Sprintf("%s election model control %s: rejected with %q in %d of %d seeds run (of %d)", backend, name, kind, rejected, ran, seeds))
	if rejected <= seeds/2 {
		t.Errorf("the judge did not reject %s with a %q violation in most of %d seeds (%d)", name, kind, seeds, rejected)
	}
}
