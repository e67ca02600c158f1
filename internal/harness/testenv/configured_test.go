package testenv

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestConfiguredServerDownFails runs a test that needs Redis in a child
// process whose FENCEKIT_TEST_REDIS names a port nobody listens on: the
// child must fail and say which variable is set, not skip and print ok.
func TestConfiguredServerDownFails(t *testing.T) {
	if os.Getenv("FENCEKIT_TESTENV_CHILD") == "1" {
		Redis(t)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestConfiguredServerDownFails$", "-test.v")
	cmd.Env = append(os.Environ(),
		"FENCEKIT_TESTENV_CHILD=1",
		"FENCEKIT_TEST_REDIS=redis://127.0.0.1:1/0",
		"FENCEKIT_REQUIRE_SERVERS=",
	)
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("child passed with a configured server that is down:\n%s", out)
	}
	if strings.Contains(string(out), "--- SKIP") {
		t.Fatalf("child skipped:\n%s", out)
	}
	if !strings.Contains(string(out), "FENCEKIT_TEST_REDIS is set") {
		t.Fatalf("child's failure does not name the variable:\n%s", out)
	}
}
