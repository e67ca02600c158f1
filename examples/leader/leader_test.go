package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"github.com/fencekit/fencekit/internal/harness/testenv"
)

// TestMain runs the test binary as a member when the parent started it as
// one (the parent re-executes its own binary).
func TestMain(m *testing.M) {
	if os.Getenv(memberEnv) == "1" {
		os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// serverArgs points a run at a schema and a key prefix of the test's own.
func serverArgs(t *testing.T) []string {
	t.Helper()
	return []string{"-postgres", testenv.PostgresURL(t), "-redis", strings.TrimPrefix(strings.TrimSuffix(testenv.RedisURL(t), "/0"), "redis://"),
		"-lock-prefix", testenv.Prefix(t), "-ttl", "300ms"}
}

// TestCommandLine runs the program as a user would: -h says in one line
// what it shows; a run stops the leader, elects another and refuses the
// resumed leader's heartbeat; -unfenced shows the overwrite.
func TestCommandLine(t *testing.T) {
	testenv.Slow(t)
	var stdout, stderr bytes.Buffer
	if code := run(t.Context(), []string{"-h"}, &stdout, &stderr); code != 0 {
		t.Fatalf("-h: exit %d, want 0", code)
	}
	first, _, _ := strings.Cut(stderr.String(), "\n")
	if !strings.HasPrefix(first, "leader: ") || !strings.Contains(stderr.String(), "go run ./examples/leader") ||
		!strings.Contains(stderr.String(), "-unfenced") || !strings.Contains(stderr.String(), "-failover") {
		t.Fatalf("-h printed:\n%s", stderr.String())
	}

	stdout.Reset()
	stderr.Reset()
	if code := run(t.Context(), serverArgs(t), &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d, stderr %q, stdout:\n%s", code, stderr.String(), stdout.String())
	}
	out := stdout.String()
	for _, want := range []string{"with SIGSTOP", "elected (term", "refused as stale (lost to term", "tokens never went back"} {
		if !strings.Contains(out, want) || strings.Contains(out, "overwrite") {
			t.Fatalf("output does not show the refused late heartbeat (%q):\n%s", want, out)
		}
	}

	stdout.Reset()
	if code := run(t.Context(), append(serverArgs(t), "-unfenced"), &stdout, &stderr); code != 0 {
		t.Fatalf("-unfenced: exit %d, stderr %q", code, stderr.String())
	}
	if out := stdout.String(); !strings.Contains(out, "overwrite: member-") || !strings.Contains(out, "a deposed leader overwrote the new leader's row") {
		t.Fatalf("-unfenced output does not show the overwrite:\n%s", out)
	}
}

// TestFailover kills the leader process twice and checks that a new leader
// wrote each time and that the figures are reported.
func TestFailover(t *testing.T) {
	testenv.Slow(t)
	var stdout, stderr bytes.Buffer
	if code := run(t.Context(), append(serverArgs(t), "-failover", "2"), &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d, stderr %q, stdout:\n%s", code, stderr.String(), stdout.String())
	}
	out := stdout.String()
	if strings.Count(out, "wrote ") != 2 || !strings.Contains(out, "2 runs, TTL 300ms: p50") {
		t.Fatalf("output does not report two failovers:\n%s", out)
	}
}

// TestUnreachableServers checks the exit status and that the message names
// the flag to fix.
func TestUnreachableServers(t *testing.T) {
	var stderr bytes.Buffer
	if code := run(t.Context(), []string{"-postgres", "postgres://postgres@127.0.0.1:1/test"}, &bytes.Buffer{}, &stderr); code != 2 || !strings.Contains(stderr.String(), "-postgres") {
		t.Fatalf("exit %d, stderr %q: want 2 naming -postgres", code, stderr.String())
	}
	stderr.Reset()
	if code := run(t.Context(), []string{"-postgres", testenv.PostgresURL(t), "-redis", "127.0.0.1:1"}, &bytes.Buffer{}, &stderr); code != 2 || !strings.Contains(stderr.String(), "-redis") {
		t.Fatalf("exit %d, stderr %q: want 2 naming -redis", code, stderr.String())
	}
	stderr.Reset()
	if code := run(t.Context(), []string{"-members", "1"}, &bytes.Buffer{}, &stderr); code != 2 {
		t.Fatalf("-members 1: exit %d, want 2", code)
	}
}
