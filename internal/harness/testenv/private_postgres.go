package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

const postgresServerHow = "install PostgreSQL's server (Debian: apt-get install postgresql), or set FENCEKIT_PG_BINDIR to the folder that holds initdb and pg_ctl"

// PostgresServer is a private PostgreSQL server on a free loopback port
// with a data directory of its own, for tests that restart or crash the
// database. It trusts every local connection and has a database named
// test. It keeps fsync off: a crash of the server (Crash) is what tests
// simulate, not a crash of the machine, and WAL written before it is read
// back at the next start as it would be in production.
type PostgresServer struct {
	t      testing.TB
	bindir string
	dir    string
	port   int
	cred   *syscall.Credential // run as this user when the tests run as root

	mu sync.Mutex
}

// StartPostgres initialises a data directory (initdb), starts a private
// PostgreSQL server on it (pg_ctl) and stops it when t ends. As root, the
// server runs as the user postgres, since initdb refuses root. It takes a
// few seconds.
func StartPostgres(t testing.TB) *PostgresServer {
	t.Helper()
	bindir, err := postgresBinDir()
	if err != nil {
		unavailable(t, "initdb and pg_ctl", postgresServerHow, err)
	}
	port, err := freePort()
	if err != nil {
		t.Fatalf("testenv: free port: %v", err)
	}
	dir, err := os.MkdirTemp("", "fencekit-pg-")
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	s := &PostgresServer{t: t, bindir: bindir, dir: dir, port: port}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			unavailable(t, "the user postgres (initdb refuses to run as root)", postgresServerHow, err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatalf("testenv: %v", err)
		}
	}
	if out, err := s.run("initdb", "-D", s.data(), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"); err != nil {
		t.Fatalf("testenv: initdb: %v: %s", err, out)
	}
	if err := s.start(); err != nil {
		t.Fatalf("testenv: start postgres: %v", err)
	}
	t.Cleanup(func() { _, _ = s.run("pg_ctl", "-D", s.data(), "-m", "immediate", "-w", "stop") })
	if out, err := s.run("psql", "-h", "127.0.0.1", "-p", strconv.Itoa(port), "-U", "postgres", "-d", "postgres", "-c", "CREATE DATABASE test"); err != nil {
		t.Fatalf("testenv: create database: %v: %s", err, out)
	}
	return s
}

func postgresBinDir() (string, error) {
	if d := os.Getenv("FENCEKIT_PG_BINDIR"); d != "" {
		return d, nil
	}
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			return filepath.Dir(real), nil
		}
		return filepath.Dir(p), nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "pg_ctl")); err == nil {
			return dirs[i], nil
		}
	}
	return "", fmt.Errorf("pg_ctl not found")
}

func (s *PostgresServer) data() string { return filepath.Join(s.dir, "data") }

// run runs one of the server's programs as the server's user.
func (s *PostgresServer) run(prog string, args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(s.bindir, prog), args...)
	cmd.Dir = s.dir
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (s *PostgresServer) start() error {
	opts := fmt.Sprintf("-p %d -c listen_addresses=127.0.0.1 -k %s -c fsync=off -c max_connections=50", s.port, s.dir)
	out, err := s.run("pg_ctl", "-D", s.data(), "-l", filepath.Join(s.dir, "log"), "-o", opts, "-w", "-t", "60", "start")
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(s.dir, "log"))
		return fmt.Errorf("%v: %s %s", err, out, log)
	}
	return nil
}

// URL returns a postgres:// URL of the server's database test.
func (s *PostgresServer) URL() string {
	return "postgres://postgres@127.0.0.1:" + strconv.Itoa(s.port) + "/test?sslmode=disable"
}

// Addr returns host:port.
func (s *PostgresServer) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Pool returns a pool of the server's database test, closed when t ends.
func (s *PostgresServer) Pool() *pgxpool.Pool {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, s.URL())
	if err != nil {
		s.t.Fatalf("testenv: pool: %v", err)
	}
	s.t.Cleanup(pool.Close)
	return pool
}

// Crash stops the server at once, as a crash would (pg_ctl stop -m
// immediate: no checkpoint; the next start runs crash recovery, which
// empties UNLOGGED tables), and starts it again on the same port. Like
// the other private servers' methods it may be called from any goroutine:
// a failure marks the test failed rather than stopping it.
func (s *PostgresServer) Crash() { s.restart("immediate") }

// Restart stops the server cleanly (a shutdown checkpoint; UNLOGGED tables
// keep their rows) and starts it again on the same port.
func (s *PostgresServer) Restart() { s.restart("fast") }

func (s *PostgresServer) restart(mode string) {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if out, err := s.run("pg_ctl", "-D", s.data(), "-m", mode, "-w", "stop"); err != nil && !strings.Contains(out, "not running") {
		s.t.Errorf("testenv: pg_ctl stop: %v: %s", err, out)
		return
	}
	if err := s.start(); err != nil {
		s.t.Errorf("testenv: restart postgres: %v", err)
	}
}
