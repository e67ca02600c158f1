package lockmodel

import (
	"fmt"
	"os"
	"testing"
)

// logControl logs a control's seed count (rejected in how many of its
// runs) and appends it to the file FENCEKIT_JUDGED_LOG names, if set, so
// that CI prints every control's count, not only those of failing runs.
func logControl(t testing.TB, rejected, runs int) {
	t.Helper()
	line := fmt.Sprintf("%s: lock model control rejected in %d of %d seeds", t.Name(), rejected, runs)
	t.Log(line)
	p := os.Getenv("FENCEKIT_JUDGED_LOG")
	if p == "" {
		return
	}
	f, err := os.OpenFile(p, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Errorf("FENCEKIT_JUDGED_LOG: %v", err)
		return
	}
	defer f.Close()
	if _, err := fmt.Fprintln(f, line); err != nil {
		t.Errorf("FENCEKIT_JUDGED_LOG: %v", err)
	}
}

// LogControl is logControl for a backend's own model, whose controls do
// not go through RunControls (the Redis lock model's): each control's
// seed count reaches the same summary.
func LogControl(t testing.TB, rejected, runs int) {
	t.Helper()
	logControl(t, rejected, runs)
}
