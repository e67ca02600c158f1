package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// noDocker points DOCKER_HOST at a socket nobody listens on.
func noDocker(t *testing.T) string {
	t.Helper()
	host := "unix://" + filepath.Join(t.TempDir(), "absent.sock")
	t.Setenv("DOCKER_HOST", host)
	return host
}

func TestDockerEngineAbsent(t *testing.T) {
	host := noDocker(t)
	err := dockerEngine()
	if err == nil || !strings.Contains(err.Error(), host) {
		t.Fatalf("dockerEngine() = %v, want an error naming %s", err, host)
	}
}

func TestDockerEnginePing(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "docker.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Skipf("unix socket: %v", err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/_ping" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte("OK"))
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	t.Setenv("DOCKER_HOST", "unix://"+sock)
	if err := dockerEngine(); err != nil {
		t.Fatalf("an engine that answers the ping: %v", err)
	}
}

// TestFindServerWithoutDocker: no variable, no local server, no Docker
// engine: the error says so for each, and no helper is started.
func TestFindServerWithoutDocker(t *testing.T) {
	noDocker(t)
	t.Setenv("FENCEKIT_TEST_NOTHING", "")
	pings := 0
	refused := errors.New("connection refused")
	_, err := findServer("redis", "FENCEKIT_TEST_NOTHING", "redis://127.0.0.1:1/0", func(string) error {
		pings++
		return refused
	})
	if err == nil {
		t.Fatal("found a server where there is none")
	}
	for _, want := range []string{"no local server (connection refused)", "no Docker engine", "absent.sock"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if pings != 1 {
		t.Errorf("pinged %d times, want once (the local server)", pings)
	}
	helpers.mu.Lock()
	defer helpers.mu.Unlock()
	if len(helpers.list) != 0 {
		t.Errorf("started %d helpers without a Docker engine", len(helpers.list))
	}
}

func TestFindServerPrefersVariable(t *testing.T) {
	noDocker(t)
	t.Setenv("FENCEKIT_TEST_SOMETHING", "redis://example:1/0")
	var pinged []string
	u, err := findServer("redis", "FENCEKIT_TEST_SOMETHING", "redis://127.0.0.1:6379/0", func(u string) error {
		pinged = append(pinged, u)
		return nil
	})
	if err != nil || u != "redis://example:1/0" || len(pinged) != 1 || pinged[0] != u {
		t.Fatalf("findServer = %q, %v after pinging %v; want the variable's URL only", u, err, pinged)
	}
}

// fakeTB records how a test ended.
type fakeTB struct {
	testing.TB
	skipped, failed string
}

func (f *fakeTB) Helper()           {}
func (f *fakeTB) Skip(args ...any)  { f.end(&f.skipped, args) }
func (f *fakeTB) Fatal(args ...any) { f.end(&f.failed, args) }

// end records the first way the test ended: the real Skip and Fatal do not
// return.
func (f *fakeTB) end(how *string, args []any) {
	if f.skipped == "" && f.failed == "" {
		*how = fmt.Sprint(args...)
	}
}

func TestUnavailableSaysHow(t *testing.T) {
	cause := errors.New("no local server (refused); no Docker engine (absent)")
	t.Setenv("FENCEKIT_REQUIRE_SERVERS", "")
	f := &fakeTB{}
	unavailable(f, "Redis", redisHow, cause)
	if f.failed != "" || !strings.Contains(f.skipped, "FENCEKIT_TEST_REDIS=") || !strings.Contains(f.skipped, "no Docker engine") {
		t.Fatalf("skip %q, failure %q: want a skip that names the cause and FENCEKIT_TEST_REDIS", f.skipped, f.failed)
	}
	t.Setenv("FENCEKIT_REQUIRE_SERVERS", "1")
	f = &fakeTB{}
	unavailable(f, "PostgreSQL", postgresHow, cause)
	if f.skipped != "" || !strings.Contains(f.failed, "FENCEKIT_TEST_POSTGRES=") || !strings.Contains(f.failed, "FENCEKIT_REQUIRE_SERVERS=1") {
		t.Fatalf("skip %q, failure %q: want a failure under FENCEKIT_REQUIRE_SERVERS=1", f.skipped, f.failed)
	}
}

// TestHelperProtocol runs a stand-in for the testservers program: its first
// line is the URL, and it runs until its standard input closes.
func TestHelperProtocol(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h, err := startHelper(ctx, t.TempDir(), "sh", "-c", "echo redis://127.0.0.1:7777/0; cat >/dev/null; echo removed >&2")
	if err != nil {
		t.Fatal(err)
	}
	if h.url != "redis://127.0.0.1:7777/0" {
		t.Fatalf("url %q", h.url)
	}
	if err := h.cmd.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("the helper exited while its stdin was open: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- h.stop() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("helper after stdin closed: %v", err)
		}
		if got := h.cmd.Stderr.(*tail).String(); !strings.Contains(got, "removed") {
			t.Fatalf("the helper did not clean up after stdin closed; stderr %q", got)
		}
	case <-ctx.Done():
		t.Fatal("the helper kept running after its stdin closed")
	}
}

func TestHelperFailureQuotesStderr(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := startHelper(ctx, t.TempDir(), "sh", "-c", "echo 'docker engine: refused' >&2; exit 1")
	if err == nil || !strings.Contains(err.Error(), "docker engine: refused") {
		t.Fatalf("startHelper = %v, want the helper's message", err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = startHelper(ctx, t.TempDir(), "sh", "-c", "exec sleep 30")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a helper that never prints: %v, want DeadlineExceeded", err)
	}
}

func TestIntegrationDir(t *testing.T) {
	dir, err := integrationDir()
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(dir) != "integration" {
		t.Fatalf("integrationDir() = %s", dir)
	}
}
