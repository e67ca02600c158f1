package election

import (
	"errors"
	"fmt"

	"github.com/fencekit/fencekit/fence"
)

var (
	// ErrNoLeader means nobody leads the election now: no term was won
	// yet, the last leader resigned or lost its lease, or the lock has just
	// been handed to a candidate that has not recorded itself yet.
	ErrNoLeader = errors.New("election: no leader")

	// ErrResigned is what [Term.Err] matches once the term ended by
	// [Term.Resign] (or by [Run] when its function returned).
	ErrResigned = errors.New("election: term resigned")

	// ErrLost is what [Term.Err] matches once the term ended because its
	// lease could no longer be known held: a renewal was refused (the lease
	// expired during a pause, or the server lost it), or renewals kept failing
	// until the lease's validity came within the step-down margin. Such
	// an error also matches [lock.ErrNotHeld].
	ErrLost = errors.New("election: term lost")

	// ErrLeading means a candidate campaigned through a [lock.Locker]
	// whose candidate already leads the election: it would wait behind its
	// own term. Resign the term first (or go on leading).
	ErrLeading = errors.New("election: this Locker's candidate already leads")

	// ErrClosed means the election's [lock.Locker] was closed: it renews no
	// lease, so [Election.Campaign] and [Run] refuse to win a term that
	// nobody would keep.
	ErrClosed = errors.New("election: the Locker is closed")
)

// invalidError is a rejected argument: it names the call and the problem,
// and matches [fence.ErrInvalid].
type invalidError struct {
	op, problem string
}

func invalid(op, format string, args ...any) error {
	return &invalidError{op: op, problem: fmt.Sprintf(format, args...)}
}

func (e *invalidError) Error() string {
	return "election: " + e.op + ": invalid argument: " + e.problem
}

func (e *invalidError) Unwrap() error { return fence.ErrInvalid }
