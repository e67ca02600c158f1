package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/fencekit/fencekit/internal/harness/workload"
)

// eventLog collects the steps of a run for the timeline.
type eventLog struct {
	mu     sync.Mutex
	events []workload.Event
}

func (l *eventLog) add(e workload.Event) {
	l.mu.Lock()
	l.events = append(l.events, e)
	l.mu.Unlock()
}

func printTable(w io.Writer, storage string, results []workload.Result) {
	fmt.Fprintf(w, "Storage: %s\n", storage)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\tattempts\tacknowledged\trefused as stale\tfinal value\tlost updates\t")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t\n", r.Mode, r.Attempts, r.Acked, r.Stale, r.Final, r.Lost)
	}
	tw.Flush()
	fmt.Fprintln(w)
}

// printLostUpdate finds two acknowledged writes that stored the same value
// on the same account (both holders read the same balance, so the later
// write undid at least one increment) and prints what happened on that
// account from the earlier grant of the two to the later write: both
// operations, every holder that came between them, and the moment each
// lease ran out before its holder wrote. It prefers a loss whose late writer
// paused past its lease, the case the demo stages.
func printLostUpdate(w io.Writer, log *eventLog, ttl time.Duration) {
	log.mu.Lock()
	events := slices.Clone(log.events)
	log.mu.Unlock()
	slices.SortStableFunc(events, func(a, b workload.Event) int { return int(a.At - b.At) })

	longPause := map[int64]bool{} // operations that paused past the lease
	grant := map[int64]workload.Event{}
	for _, e := range events {
		switch {
		case e.Kind == workload.Paused && e.Pause > ttl:
			longPause[e.Op] = true
		case e.Kind == workload.Acquired:
			grant[e.Op] = e
		}
	}
	type slot struct {
		resource string
		n        int64
	}
	first := map[slot]workload.Event{}
	var a, b workload.Event // b's write undid a's increment
	found := false
	for _, e := range events {
		if e.Kind != workload.Written {
			continue
		}
		k := slot{e.Resource, e.State.N}
		prev, ok := first[k]
		if !ok {
			first[k] = e
			continue
		}
		if !found || longPause[e.Op] {
			a, b, found = prev, e, true
			if longPause[e.Op] {
				break
			}
		}
	}
	if !found {
		fmt.Fprintln(w, "No lost update was caught in this run's timeline.")
		fmt.Fprintln(w)
		return
	}

	start := min(grant[a.Op].At, grant[b.Op].At)
	shown := map[int64]bool{}
	for _, e := range events {
		if e.Resource == a.Resource && e.At >= start && e.At <= b.At {
			shown[e.Op] = true
		}
	}
	var steps []workload.Event
	overwritten := b.State.N - 1 // the balance b's write replaced
	for _, e := range events {
		if !shown[e.Op] || e.Resource != a.Resource {
			continue
		}
		steps = append(steps, e)
		if e.Kind == workload.Written && e.Op != b.Op && e.At < b.At {
			overwritten = e.State.N
		}
		// A holder that writes after its lease ran out: show the moment.
		if (e.Kind == workload.Written || e.Kind == workload.Refused) && e.At > grant[e.Op].At+ttl {
			x := grant[e.Op]
			x.Kind, x.At = leaseExpired, x.At+ttl
			steps = append(steps, x)
		}
	}
	slices.SortStableFunc(steps, func(a, b workload.Event) int { return int(a.At - b.At) })
	t0 := steps[0].At
	fmt.Fprintf(w, "One lost update as it happened with the lock alone (%s, every holder in between):\n", shortName(a.Resource))
	for _, e := range steps {
		fmt.Fprintf(w, "  %+8.1fms  worker %-2d token %-16d %s\n", ms(e.At-t0), e.Worker, e.Token, describe(e, ttl))
	}
	fmt.Fprintf(w, "  Worker %d computed balance %d from a read made while it held the lock, but wrote it after\n", b.Worker, b.State.N)
	fmt.Fprintf(w, "  its lease ran out, over balance %d: at that moment it undid %d acknowledged increment(s).\n",
		overwritten, overwritten-b.State.N+1)
	fmt.Fprintln(w, "  (Another late write may put a value back later; the table counts what was lost in the end.)")
	fmt.Fprintln(w, "  With fencing, storage has admitted a newer token by then, so that late write is refused as stale.")
	fmt.Fprintln(w)
}

// leaseExpired marks, in the timeline only, the moment a lease ran out.
const leaseExpired workload.EventKind = -1

// shortName drops the run's prefix from a resource name for display.
func shortName(resource string) string {
	if i := strings.LastIndex(resource, "-acct-"); i >= 0 {
		return resource[i+1:]
	}
	return resource
}

func describe(e workload.Event, ttl time.Duration) string {
	switch e.Kind {
	case leaseExpired:
		return fmt.Sprintf("(by now its %v lease has run out: the lock is free; its holder does not know)", ttl)
	case workload.Acquired:
		return "acquired the lock"
	case workload.ReadDone:
		return fmt.Sprintf("read balance %d", e.State.N)
	case workload.Paused:
		s := fmt.Sprintf("paused %v", e.Pause.Round(100*time.Microsecond))
		if e.Pause > ttl {
			s += fmt.Sprintf(" (lease is %v: it expires meanwhile)", ttl)
		}
		return s
	case workload.Written:
		return fmt.Sprintf("wrote balance %d, acknowledged", e.State.N)
	case workload.Refused:
		return "refused as stale: " + firstLine(e.Err)
	default:
		return "failed: " + firstLine(e.Err)
	}
}

func firstLine(err error) string {
	if err == nil {
		return ""
	}
	s, _, _ := strings.Cut(err.Error(), "\n")
	return s
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
