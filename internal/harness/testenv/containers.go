package testenv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Containers are started by a helper program of the integration module
// (internal/integration/cmd/testservers), not by this package: testcontainers
// and the Docker client it pulls in would otherwise sit in the module graph of
// every program that depends on fencekit, since `go mod tidy` there loads the
// tests of our packages, and with them this package.
//
// The helper prints the container's URL on one line and keeps the container
// until its standard input closes. This package holds the write end of that
// pipe for the life of the test binary, so the container goes when the binary
// exits, however it exits; testcontainers' reaper removes it too.

// findServer returns the URL of a server of the given kind: the one named by
// the environment variable env, else the local one when it answers, else a
// container when a Docker engine answers.
func findServer(kind, env, local string, ping func(url string) error) (string, error) {
	if u := os.Getenv(env); u != "" {
		if err := ping(u); err != nil {
			return u, &configuredError{env: env, err: err}
		}
		return u, nil
	}
	localErr := ping(local)
	if localErr == nil {
		return local, nil
	}
	u, err := container(kind)
	if err != nil {
		return "", fmt.Errorf("no local server (%v); %w", localErr, err)
	}
	return u, ping(u)
}

// helperStart bounds building and starting the helper, including the first
// pull of the image.
const helperStart = 5 * time.Minute

// helpers keeps every started helper reachable: an unreferenced pipe would be
// closed by its finalizer, and the helper would remove the container early.
var helpers struct {
	mu   sync.Mutex
	list []*helper
}

// container starts a server of the given kind ("redis", "postgres" or "mysql") through
// the helper and returns its URL.
func container(kind string) (string, error) {
	if err := dockerEngine(); err != nil {
		return "", fmt.Errorf("no Docker engine (%w)", err)
	}
	dir, err := integrationDir()
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), helperStart)
	defer cancel()
	h, err := startHelper(ctx, dir, "go", "run", "./cmd/testservers", kind)
	if err != nil {
		return "", fmt.Errorf("container: %w", err)
	}
	helpers.mu.Lock()
	helpers.list = append(helpers.list, h)
	helpers.mu.Unlock()
	return h.url, nil
}

// integrationDir finds the integration module from the working directory
// (a package directory, under go test) by walking up to the repository's
// go.work.
func integrationDir() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			mod := filepath.Join(dir, "internal", "integration")
			if _, err := os.Stat(filepath.Join(mod, "go.mod")); err != nil {
				return "", fmt.Errorf("no integration module next to %s", filepath.Join(dir, "go.work"))
			}
			return mod, nil
		}
		if filepath.Dir(dir) == dir {
			return "", fmt.Errorf("no go.work above %s: containers need a checkout of the repository", wd)
		}
	}
}

// helper is a running helper process.
type helper struct {
	url   string
	cmd   *exec.Cmd
	stdin io.WriteCloser
}

// stop closes the helper's standard input, which tells it to remove its
// container, and waits for it to exit.
func (h *helper) stop() error {
	_ = h.stdin.Close()
	return h.cmd.Wait()
}

// startHelper runs name with args in dir and returns once the program has
// printed its first line, the URL. A program that exits first, or does not
// print within ctx, is an error that quotes the end of its standard error.
func startHelper(ctx context.Context, dir, name string, args ...string) (*helper, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.WaitDelay = 5 * time.Second // a grandchild holding the pipes must not hang Wait
	stderr := &tail{max: 2048}
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	type line struct {
		s   string
		err error
	}
	first := make(chan line, 1)
	go func() {
		r := bufio.NewReader(stdout)
		s, err := r.ReadString('\n')
		first <- line{strings.TrimSpace(s), err}
		_, _ = io.Copy(io.Discard, r)
	}()
	fail := func(err error) (*helper, error) {
		_ = stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			return nil, fmt.Errorf("%s: %w: %s", strings.Join(cmd.Args, " "), err, msg)
		}
		return nil, fmt.Errorf("%s: %w", strings.Join(cmd.Args, " "), err)
	}
	select {
	case l := <-first:
		if l.err != nil || l.s == "" {
			return fail(errors.New("exited without printing a URL"))
		}
		return &helper{url: l.s, cmd: cmd, stdin: stdin}, nil
	case <-ctx.Done():
		return fail(ctx.Err())
	}
}

// dockerEngine reports whether a Docker engine answers a ping at DOCKER_HOST,
// or else at one of the usual local sockets. Hosts it cannot ping by itself
// (TLS, ssh) count as answering; the helper then reports what goes wrong.
func dockerEngine() error {
	if h := os.Getenv("DOCKER_HOST"); h != "" {
		return pingDocker(h)
	}
	candidates := []string{"unix:///var/run/docker.sock"}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		candidates = append(candidates, "unix://"+filepath.Join(d, "docker.sock"))
	}
	if d, err := os.UserHomeDir(); err == nil {
		candidates = append(candidates, "unix://"+filepath.Join(d, ".docker", "run", "docker.sock"))
	}
	var errs []error
	for _, c := range candidates {
		err := pingDocker(c)
		if err == nil {
			return nil
		}
		errs = append(errs, err)
	}
	return fmt.Errorf("DOCKER_HOST unset and no engine on the default sockets: %w", errors.Join(errs...))
}

func pingDocker(host string) error {
	u, err := url.Parse(host)
	if err != nil {
		return fmt.Errorf("DOCKER_HOST %q: %w", host, err)
	}
	var dial func(ctx context.Context) (net.Conn, error)
	var d net.Dialer
	switch {
	case u.Scheme == "unix":
		dial = func(ctx context.Context) (net.Conn, error) { return d.DialContext(ctx, "unix", u.Path) }
	case u.Scheme == "tcp" && os.Getenv("DOCKER_TLS_VERIFY") == "":
		dial = func(ctx context.Context) (net.Conn, error) { return d.DialContext(ctx, "tcp", u.Host) }
	default:
		return nil
	}
	c := &http.Client{
		Timeout: 3 * time.Second,
		Transport: &http.Transport{
			DialContext:       func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
			DisableKeepAlives: true,
		},
	}
	resp, err := c.Get("http://docker/_ping")
	if err != nil {
		return fmt.Errorf("%s: %w", host, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: ping: %s", host, resp.Status)
	}
	return nil
}

// tail keeps the last max bytes written to it.
type tail struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}
