package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/fencekit/fencekit/internal/harness/testenv"
)

// build compiles the program, as a user's go run would.
func build(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "quickstart")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func runBin(t *testing.T, bin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var o, e bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return o.String(), e.String(), code
}

// TestQuickstart runs the program twice against a private Redis and a
// PostgreSQL schema of the test's own: the first run creates everything, the
// second finds it in place, and each adds 5 in both stores.
func TestQuickstart(t *testing.T) {
	t.Parallel()
	redisAddr := testenv.StartRedis(t).Addr()
	pgURL := testenv.PostgresURL(t)
	bin := build(t)
	fenceLine := regexp.MustCompile(`^lock taken, fence "invoice:42" token=\d+ holder=#[0-9a-f]{8}$`)
	for _, total := range []string{"5", "10"} {
		out, errOut, code := runBin(t, bin, "-redis", redisAddr, "-postgres", pgURL)
		if code != 0 {
			t.Fatalf("exit status %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		want := []string{
			"",
			"PostgreSQL: invoice 42 total is now " + total,
			"Redis: invoice:42:total is now " + total,
		}
		if len(lines) != len(want) || !fenceLine.MatchString(lines[0]) {
			t.Fatalf("output:\n%s", out)
		}
		for i := 1; i < len(want); i++ {
			if lines[i] != want[i] {
				t.Errorf("line %d = %q, want %q", i+1, lines[i], want[i])
			}
		}
	}
}

// TestQuickstartUnreachable: a server that is down fails the run with status
// 1 and a message that says which step failed and why, without the password.
func TestQuickstartUnreachable(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	closed := closedAddr(t)
	bin := build(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-redis", closed, "-postgres", testenv.PostgresURL(t)}, "quickstart: lock: acquire \"invoice:42\": dial tcp " + closed},
		{[]string{"-postgres", "postgres://postgres:secret@" + closed + "/test"}, "quickstart: apply migrations: "},
	} {
		out, errOut, code := runBin(t, bin, tc.args...)
		if code != 1 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: status %d, stdout %q, stderr %q; want status 1 and a message with %q", tc.args, code, out, errOut, tc.want)
		}
		if strings.Contains(errOut, "secret") {
			t.Errorf("the message shows the password: %q", errOut)
		}
	}
}

// TestREADMEQuickStart: the README's Quick start code is the marked region
// of quickstart.go, a whole program (package clause aside), so the README
// shows a program that compiles and runs.
func TestREADMEQuickStart(t *testing.T) {
	src, err := os.ReadFile("quickstart.go")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, region, ok := bytes.Cut(src, []byte("// README quick start: begin\n"))
	region, _, ok2 := bytes.Cut(region, []byte("\n// README quick start: end"))
	if !ok || !ok2 {
		t.Fatal("quickstart.go lost its README quick start markers")
	}
	_, section, ok := bytes.Cut(readme, []byte("\n## Quick start\n"))
	if !ok {
		t.Fatal("README has no Quick start section")
	}
	_, block, ok := bytes.Cut(section, []byte("```go\n"))
	block, _, ok2 = bytes.Cut(block, []byte("```\n"))
	if !ok || !ok2 {
		t.Fatal("README's Quick start has no go code block")
	}
	want := "package main\n\n" + strings.TrimSpace(string(region))
	if got := strings.TrimSpace(string(block)); got != want {
		t.Fatalf("README's Quick start differs from examples/quickstart/quickstart.go; paste the region between the markers:\n%s", want)
	}
}
