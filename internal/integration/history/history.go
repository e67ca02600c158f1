package history

import (
	"cmp"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// Recorder keeps the history of one run: the invocation and return of every
// call, timed by one monotonic clock. It is safe for concurrent use.
type Recorder struct {
	start time.Time
	mu    sync.Mutex
	ops   []porcupine.Operation
	open  int
}

// NewRecorder starts an empty history.
func NewRecorder() *Recorder { return &Recorder{start: time.Now()} }

// Call is one recorded call, between its invocation and its return.
type Call struct {
	r *Recorder
	i int
}

func (r *Recorder) now() int64 { return int64(time.Since(r.start)) }

// Invoke records the invocation of a call by client with input in, now.
// Take it right before the call is sent.
func (r *Recorder) Invoke(client int, in any) Call {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops = append(r.ops, porcupine.Operation{ClientId: client, Input: in, Call: r.now(), Return: math.MaxInt64})
	return Call{r: r, i: len(r.ops) - 1}
}

// InvokeSince records the invocation of a call by client with input in, at
// the invocation of since: for a call known to have started after since was
// invoked, but not when (a step inside a library call).
func (r *Recorder) InvokeSince(client int, in any, since Call) Call {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops = append(r.ops, porcupine.Operation{ClientId: client, Input: in, Call: r.ops[since.i].Call, Return: math.MaxInt64})
	return Call{r: r, i: len(r.ops) - 1}
}

// Return records the call's return with output out, now. Take it right
// after the reply arrived.
func (c Call) Return(out any) {
	c.r.mu.Lock()
	defer c.r.mu.Unlock()
	op := &c.r.ops[c.i]
	op.Output, op.Return = out, c.r.now()
}

// Note attaches a remark to the call, shown in the HTML view and the text
// of a rejected history: a fault the call met, for example.
func (c Call) Note(remark string) {
	c.r.mu.Lock()
	defer c.r.mu.Unlock()
	c.r.ops[c.i].Metadata = remark
}

// Open records a call whose outcome is unknown: it stays open to the end of
// the history, so the checker may place it anywhere after its invocation,
// and out must be an output the model accepts for an applied call and for
// one that never ran.
func (c Call) Open(out any) {
	c.r.mu.Lock()
	defer c.r.mu.Unlock()
	op := &c.r.ops[c.i]
	op.Output, op.Return = out, math.MaxInt64
	c.r.open++
}

// Tally counts by kind, as [Tally] does, the calls recorded so far that
// have returned or been left open; calls still under way are not counted.
// It may be called while calls are made.
func (r *Recorder) Tally(kinds func(op porcupine.Operation) []string) Judgments {
	r.mu.Lock()
	defer r.mu.Unlock()
	j := Judgments{}
	for _, op := range r.ops {
		if op.Output == nil {
			continue
		}
		for _, k := range kinds(op) {
			j[k]++
		}
	}
	return j
}

// Operations returns the history so far; every call must have returned or
// been left open.
func (r *Recorder) Operations() []porcupine.Operation {
	r.mu.Lock()
	defer r.mu.Unlock()
	ops := make([]porcupine.Operation, len(r.ops))
	copy(ops, r.ops)
	for i := range ops {
		if ops[i].Output == nil {
			panic(fmt.Sprintf("history: call %d (%v) neither returned nor was left open", i, ops[i].Input))
		}
	}
	return ops
}

// Counts returns how many calls were recorded, and how many of them were
// left open.
func (r *Recorder) Counts() (calls, open int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.ops), r.open
}

// Verdict is the checker's judgement of one history.
type Verdict struct {
	Result porcupine.CheckResult
	Took   time.Duration
	// File is the HTML view of a rejected history, when one was written.
	File string
	// Text lists the calls of the rejected keys, when File was written.
	Text string
}

// Check runs porcupine on ops against model, giving up after timeout
// (porcupine.Unknown). A rejected history is written as porcupine's HTML
// view to a file named after name and the seed, in FENCEKIT_HISTORY_DIR
// (default: the system's temporary directory).
func Check(model porcupine.Model, ops []porcupine.Operation, timeout time.Duration, name string, seed uint64) (Verdict, error) {
	start := time.Now()
	res, info := porcupine.CheckOperationsVerbose(model, ops, timeout)
	v := Verdict{Result: res, Took: time.Since(start)}
	if res != porcupine.Illegal {
		return v, nil
	}
	dir := os.Getenv("FENCEKIT_HISTORY_DIR")
	if dir == "" {
		dir = os.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return v, fmt.Errorf("history: %w", err)
	}
	v.File = filepath.Join(dir, fmt.Sprintf("fencekit-%s-seed%d.html", name, seed))
	if err := porcupine.VisualizePath(model, info, v.File); err != nil {
		return v, fmt.Errorf("history: write %s: %w", v.File, err)
	}
	v.Text = strings.TrimSuffix(v.File, ".html") + ".txt"
	if err := os.WriteFile(v.Text, []byte(rejected(model, ops)), 0o644); err != nil {
		return v, fmt.Errorf("history: write %s: %w", v.Text, err)
	}
	return v, nil
}

// rejected lists, as text, the calls of every partition (key) that the
// checker rejects on its own, in invocation order: the smallest history to
// read by hand.
func rejected(model porcupine.Model, ops []porcupine.Operation) string {
	parts := [][]porcupine.Operation{ops}
	if model.Partition != nil {
		parts = model.Partition(ops)
	}
	var b strings.Builder
	for _, part := range parts {
		if porcupine.CheckOperationsTimeout(model, part, time.Minute) != porcupine.Illegal {
			continue
		}
		sorted := slices.Clone(part)
		slices.SortStableFunc(sorted, func(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) })
		k := shortestRejected(model, sorted)
		fmt.Fprintf(&b, "rejected partition of %d calls (times in ms since the start; open calls end at +inf); the first %d calls are rejected already, the last of them is marked:\n", len(sorted), k)
		for i, op := range sorted {
			if i == k-1 {
				b.WriteString("=>")
			} else {
				b.WriteString("  ")
			}
			ret := "+inf"
			if op.Return != math.MaxInt64 {
				ret = fmt.Sprintf("%.3f", float64(op.Return)/1e6)
			}
			note := ""
			if op.Metadata != nil {
				note = fmt.Sprintf("  (%v)", op.Metadata)
			}
			fmt.Fprintf(&b, "client %d  [%.3f, %s]  %s%s\n", op.ClientId, float64(op.Call)/1e6, ret, model.DescribeOperation(op.Input, op.Output), note)
		}
	}
	return b.String()
}

// shortestRejected returns the smallest k such that the calls invoked up
// to sorted[k-1] are rejected on their own, each call still running then
// taken as open (its output unknown): where in the history the checker first
// gets stuck. sorted is in invocation order and rejected as a whole.
func shortestRejected(model porcupine.Model, sorted []porcupine.Operation) int {
	rejects := func(k int) bool {
		at := sorted[k-1].Call
		prefix := make([]porcupine.Operation, k)
		for i, op := range sorted[:k] {
			if op.Return > at {
				op.Return = math.MaxInt64
				op.Output = openOutput(op.Output)
				if in, ok := op.Input.(RedisIn); ok {
					in.To = op.Return // the Redis model reads the times from the input (StampRedis)
					op.Input = in
				}
			}
			prefix[i] = op
		}
		return porcupine.CheckOperationsTimeout(model, prefix, 10*time.Second) == porcupine.Illegal
	}
	lo, hi := 1, len(sorted)
	for lo < hi {
		mid := (lo + hi) / 2
		if rejects(mid) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}

// openOutput returns the output of an open call of the same kind as out.
func openOutput(out any) any {
	switch out.(type) {
	case RedisOut:
		return RedisOut{Status: Unknown}
	case PgOut:
		return PgOut{Status: Unknown}
	}
	return out
}

// Judgments counts what a checker judged, by kind: the calls of each kind
// that returned a definite answer (which the model must explain exactly),
// the refusals it judged, the open calls it had to place, the attacks it
// saw refused. A run that judged too little of a kind proves nothing about
// it, whatever its verdict: see [Judgments.Require].
type Judgments map[string]int64

// Tally counts the kinds of every call in ops: kinds returns the kinds one
// call counts for (none, one or several).
func Tally(ops []porcupine.Operation, kinds func(op porcupine.Operation) []string) Judgments {
	j := Judgments{}
	for _, op := range ops {
		for _, k := range kinds(op) {
			j[k]++
		}
	}
	return j
}

// Floors is the least a run must judge of each kind.
type Floors map[string]int64

// Rates is the least a run must judge of each kind per second of its
// budget: what a loaded machine makes, with a wide margin.
type Rates map[string]float64

// For returns the floors of a run lasting d: each rate times d, and at
// least one of each kind.
func (r Rates) For(d time.Duration) Floors {
	f := Floors{}
	for k, per := range r {
		f[k] = max(1, int64(math.Ceil(per*d.Seconds())))
	}
	return f
}

// Meets reports whether j holds at least each of floors.
func (j Judgments) Meets(floors Floors) bool {
	for k, fl := range floors {
		if j[k] < fl {
			return false
		}
	}
	return true
}

// Require logs the judgments of the run named name with their floors, one
// line that CI's summary shows, and fails t for every kind judged fewer
// times than its floor: a run that judged nothing of a kind passes
// otherwise, whatever the code does. Kinds without a floor are logged
// only. The floors bind a run with a budget (FENCEKIT_CHECK_TIME, as CI's
// checkers set); the plain test run of a few seconds only logs a shortfall.
func (j Judgments) Require(t testing.TB, name string, floors Floors) {
	t.Helper()
	kinds := make([]string, 0, len(j)+len(floors))
	for k := range j {
		kinds = append(kinds, k)
	}
	for k := range floors {
		if _, ok := j[k]; !ok {
			kinds = append(kinds, k)
		}
	}
	slices.Sort(kinds)
	var b, low strings.Builder
	for _, k := range kinds {
		fl, ok := floors[k]
		if !ok {
			fmt.Fprintf(&b, " %s=%d;", k, j[k])
			continue
		}
		fmt.Fprintf(&b, " %s=%d (floor %d);", k, j[k], fl)
		if j[k] < fl {
			fmt.Fprintf(&low, " %s: %d < %d;", k, j[k], fl)
		}
	}
	t.Logf("%s judged:%s", name, strings.TrimSuffix(b.String(), ";"))
	if low.Len() > 0 && os.Getenv("FENCEKIT_CHECK_TIME") == "" {
		// The plain test run lasts a few seconds, too few for the rarer
		// kinds on a loaded machine: the floors bind a run with a budget.
		t.Logf("%s judged fewer than the floors of a budgeted run (FENCEKIT_CHECK_TIME) of:%s", name, strings.TrimSuffix(low.String(), ";"))
		return
	}
	if low.Len() > 0 {
		t.Errorf("%s judged too few:%s the run proves nothing about these kinds (a longer FENCEKIT_CHECK_TIME, or a workload that makes them)",
			name, strings.TrimSuffix(low.String(), ";"))
	}
}
