package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/fencekit/fencekit/internal/harness/testenv"
)

// TestRun runs the program against the test's PostgreSQL: the three
// deposits land, the stale fence is refused through GORM, sqlx and bun, and
// the balance is 35.
func TestRun(t *testing.T) {
	u := testenv.PostgresURL(t)
	var stdout, stderr bytes.Buffer
	if code := run(t.Context(), []string{"-postgres", u}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	for _, want := range []string{"GORM: deposited 10", "sqlx: deposited 5", "bun: deposited 20", "refused through GORM, sqlx and bun", "balance: 35"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, stdout.String())
		}
	}
}

// TestCommandLine: -h says in one line what the example shows and exits 0;
// an unreachable server exits 2 and says what to do.
func TestCommandLine(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run(t.Context(), []string{"-h"}, &stdout, &stderr); code != 0 {
		t.Fatalf("-h: exit %d, want 0", code)
	}
	if !strings.HasPrefix(stderr.String(), "pgsqlorm: a fenced write through GORM, sqlx and bun") || !strings.Contains(stderr.String(), "-postgres") {
		t.Fatalf("-h printed:\n%s", stderr.String())
	}
	stderr.Reset()
	if code := run(t.Context(), []string{"-postgres", "postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=2"}, &stdout, &stderr); code != 2 {
		t.Fatalf("unreachable server: exit %d, want 2 (%s)", code, stderr.String())
	}
	if !strings.Contains(stderr.String(), "pass -postgres URL") {
		t.Fatalf("unreachable server printed:\n%s", stderr.String())
	}
}
