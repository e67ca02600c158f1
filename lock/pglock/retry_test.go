package pglock

import (
	"errors"
	"testing"
)

// safeToRetryError is an error pgx would call safe to retry: it failed
// before anything was sent.
type safeToRetryError struct{}

func (safeToRetryError) Error() string     { return "not sent" }
func (safeToRetryError) SafeToRetry() bool { return true }

// TestAnEarlierLostTryKeepsTheOutcomeUnknown: when the last try of a
// statement failed before sending but an earlier one lost its reply, the
// statement may have run, and the error must say so, so that a grant it
// may have made is released rather than forgotten.
func TestAnEarlierLostTryKeepsTheOutcomeUnknown(t *testing.T) {
	last := safeToRetryError{}
	if mayHaveRun(last) {
		t.Fatal("an error pgx calls safe to retry counts as run")
	}
	if !brokenSession(last) {
		t.Fatal("an error pgx calls safe to retry is not retried")
	}
	err := error(&sentError{err: last})
	if !mayHaveRun(err) {
		t.Fatalf("mayHaveRun(%v) = false after an earlier try whose reply was lost", err)
	}
	if !errors.Is(err, last) {
		t.Fatal("the last try's error is not wrapped")
	}
}
