package workload

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/fencekit/fencekit/fence"
)

// State is a resource's counter: how many increments it holds and the token
// of the write that stored it.
type State struct {
	N    int64
	Last fence.Token
}

// String encodes s as "N:Last".
func (s State) String() string {
	return strconv.FormatInt(s.N, 10) + ":" + strconv.FormatInt(int64(s.Last), 10)
}

// ParseState decodes what [State.String] encodes; empty input is the zero
// State.
func ParseState(b []byte) (State, error) {
	if len(b) == 0 {
		return State{}, nil
	}
	n, last, ok := strings.Cut(string(b), ":")
	if !ok {
		return State{}, fmt.Errorf("workload: bad state %q", b)
	}
	nn, err := strconv.ParseInt(n, 10, 64)
	if err != nil {
		return State{}, fmt.Errorf("workload: bad state %q: %w", b, err)
	}
	lt, err := strconv.ParseInt(last, 10, 64)
	if err != nil {
		return State{}, fmt.Errorf("workload: bad state %q: %w", b, err)
	}
	return State{N: nn, Last: fence.Token(lt)}, nil
}

// Counter is storage that holds one counter per resource, readable and
// writable with and without a fence.
type Counter interface {
	// Name names the storage in reports.
	Name() string
	// Setup prepares the counters of resources (zero state) for a mode.
	Setup(ctx context.Context, mode Mode, resources []string) error
	// Read returns resource's counter: a fenced read in Fenced mode, a plain
	// one otherwise.
	Read(ctx context.Context, mode Mode, f fence.Fence, resource string) (State, error)
	// Write stores s as resource's counter: a fenced write in Fenced and
	// UnfencedReads modes, a plain one in Plain mode.
	Write(ctx context.Context, mode Mode, f fence.Fence, resource string, s State) error
	// Final reads resource's counter after the run, without a fence.
	Final(ctx context.Context, mode Mode, resource string) (State, error)
}

// Mode says which operations a run fences.
type Mode int

const (
	// Plain uses the lock alone: plain reads and plain writes.
	Plain Mode = iota
	// UnfencedReads fences writes but not reads.
	UnfencedReads
	// Fenced fences reads and writes.
	Fenced
)

// String names the mode for reports.
func (m Mode) String() string {
	switch m {
	case Plain:
		return "plain lock"
	case UnfencedReads:
		return "fenced writes, plain reads"
	case Fenced:
		return "fenced"
	}
	return "mode(" + strconv.Itoa(int(m)) + ")"
}
