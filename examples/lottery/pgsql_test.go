package main

import (
	"bytes"
	"strings"
	"testing"
)

// testPgsqlConfig is testConfig with the draw recorded through
// database/sql and storage/pgsql.
func testPgsqlConfig(t *testing.T) Config {
	t.Helper()
	cfg := testConfig(t)
	cfg.Store = storePgsql
	return cfg
}

// TestPgsqlCommandLine runs the program's flags: -store pgsql draws once
// despite the pause.
func TestPgsqlCommandLine(t *testing.T) {
	cfg := testPgsqlConfig(t)
	var stdout, stderr bytes.Buffer
	args := []string{"-store", "pgsql", "-postgres", cfg.PostgresURL, "-redis", cfg.Redis.Addr, "-pause", "-ttl", "200ms", "-day", "2032-05-01"}
	if code := run(t.Context(), args, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	if out := stdout.String(); !strings.Contains(out, "on pgsql") || !strings.Contains(out, "refused as stale") || !strings.Contains(out, "completion record lottery-draw:2032-05-01") || strings.Contains(out, "corrupt") {
		t.Fatalf("output does not show one clean draw with the paused instance refused:\n%s", out)
	}
}
