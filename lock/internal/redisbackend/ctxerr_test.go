package redisbackend

import (
	"context"
	"errors"
	"net"
	"os"
	"testing"
	"time"
)

// pastDeadline is a context whose deadline has passed while its own timer has
// not fired yet (Err is still nil), as a loaded machine leaves it for a moment
// after a client made with ContextTimeoutEnabled ended its read at the
// deadline.
type pastDeadline struct{ context.Context }

func (pastDeadline) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

// A call that the client ended at the context's deadline, with a network
// timeout, reports the deadline even before the context's timer has run.
func TestACallEndedAtTheDeadlineMatchesIt(t *testing.T) {
	err := translate(pastDeadline{context.Background()}, &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}, "acquire", "r")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a call ended at the deadline = %v, want an error matching context.DeadlineExceeded", err)
	}
	// A timeout before the deadline is the client's own, not the context's.
	early, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	if err := translate(early, &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}, "acquire", "r"); errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a read timeout an hour before the deadline = %v, matches context.DeadlineExceeded", err)
	}
}
