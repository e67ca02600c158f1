package testenv

import (
	"errors"
	"os"
	"testing"
)

// configuredError is a server that the environment names explicitly and
// that does not answer: a failure, never a skip, since the user asked for it.
type configuredError struct {
	env string
	err error
}

func (e *configuredError) Error() string {
	return e.env + " is set, but that server does not answer: " + e.err.Error()
}

func (e *configuredError) Unwrap() error { return e.err }

// RequireServers reports whether a missing server must fail the test rather
// than skip it (FENCEKIT_REQUIRE_SERVERS=1, set by CI).
func RequireServers() bool { return os.Getenv("FENCEKIT_REQUIRE_SERVERS") == "1" }

// unavailable skips t, or fails it under FENCEKIT_REQUIRE_SERVERS=1, with a
// message that names what is missing and how to provide it.
func unavailable(t testing.TB, what, how string, cause error) {
	t.Helper()
	if ce := (*configuredError)(nil); errors.As(cause, &ce) {
		t.Fatalf("%s unavailable: %v; start it, or unset %s to use the local default", what, cause, ce.env)
	}
	msg := what + " unavailable"
	if cause != nil {
		msg += " (" + cause.Error() + ")"
	}
	msg += "; " + how
	if RequireServers() {
		t.Fatal(msg + " [FENCEKIT_REQUIRE_SERVERS=1 makes this a failure]")
	}
	t.Skip(msg)
}

// Slow skips t under go test -short: it is a fault scenario or a workload
// that takes seconds, and the short run covers the API surface without it.
func Slow(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("slow scenario: runs without -short")
	}
}
