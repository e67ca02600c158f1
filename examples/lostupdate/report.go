package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/fencekit/fencekit/internal/workload"
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
// on the same account (both read the same balance, so one increment
// vanished) and prints the steps of both operations.
func printLostUpdate(w io.Writer, log *eventLog, ttl time.Duration) {
	log.mu.Lock()
	events := slices.Clone(log.events)
	log.mu.Unlock()
	slices.SortStableFunc(events, func(a, b workload.Event) int { return int(a.At - b.At) })

	type slot struct {
		resource string
		n        int64
	}
	first := map[slot]int64{}
	var opA, opB int64
	for _, e := range events {
		if e.Kind != workload.Written {
			continue
		}
		k := slot{e.Resource, e.State.N}
		if op, ok := first[k]; ok {
			opA, opB = op, e.Op
			break
		}
		first[k] = e.Op
	}
	if opA == 0 {
		fmt.Fprintln(w, "No lost update was caught in this run's timeline.")
		fmt.Fprintln(w)
		return
	}
	var steps []workload.Event
	for _, e := range events {
		if e.Op == opA || e.Op == opB {
			steps = append(steps, e)
		}
	}
	t0 := steps[0].At
	fmt.Fprintln(w, "One lost update as it happened with the lock alone:")
	for _, e := range steps {
		fmt.Fprintf(w, "  %+8.1fms  worker %-2d token %-4d %s\n", ms(e.At-t0), e.Worker, e.Token, describe(e, ttl))
	}
	fmt.Fprintln(w, "  Both wrote the same balance: one acknowledged increment is gone.")
	fmt.Fprintln(w, "  With fencing, the paused worker's write carries the older token and is refused.")
	fmt.Fprintln(w)
}

func describe(e workload.Event, ttl time.Duration) string {
	switch e.Kind {
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
