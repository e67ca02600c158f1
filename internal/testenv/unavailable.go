package testenv

import (
	"os"
	"testing"
)

// RequireServers reports whether a missing server must fail the test rather
// than skip it (FENCEKIT_REQUIRE_SERVERS=1, set by CI).
func RequireServers() bool { return os.Getenv("FENCEKIT_REQUIRE_SERVERS") == "1" }

// unavailable skips t, or fails it under FENCEKIT_REQUIRE_SERVERS=1, with a
// message that names what is missing and how to provide it.
func unavailable(t testing.TB, what, how string, cause error) {
	t.Helper()
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
