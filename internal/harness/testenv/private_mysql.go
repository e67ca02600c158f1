package testenv

import (
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

const mariadbdHow = "install MariaDB (Debian: apt-get install mariadb-server), or set FENCEKIT_MARIADBD and FENCEKIT_MARIADB_INSTALL_DB to the paths of mariadbd and mariadb-install-db"

// MySQLServer is a private MariaDB server (mariadbd) on a free loopback
// port with a data directory of its own, for tests that kill or restart the
// database. Its data is durable as a production server's is
// (innodb_flush_log_at_trx_commit=1): a kill loses no committed
// transaction.
type MySQLServer struct {
	t        testing.TB
	bin, dir string
	port     int
	asRoot   bool
	mu       sync.Mutex
	proc     *os.Process
	exited   chan struct{}
}

// StartMySQL initialises a data directory, starts a private mariadbd with a
// database named test and root access without a password, and kills it
// when t ends. It takes a few seconds.
func StartMySQL(t testing.TB) *MySQLServer {
	t.Helper()
	bin, err := lookBinary("FENCEKIT_MARIADBD", "mariadbd", "mysqld")
	if err != nil {
		unavailable(t, "mariadbd binary", mariadbdHow, err)
	}
	installDB, err := lookBinary("FENCEKIT_MARIADB_INSTALL_DB", "mariadb-install-db", "mysql_install_db")
	if err != nil {
		unavailable(t, "mariadb-install-db binary", mariadbdHow, err)
	}
	port, err := freePort()
	if err != nil {
		t.Fatalf("testenv: free port: %v", err)
	}
	s := &MySQLServer{t: t, bin: bin, dir: t.TempDir(), port: port, asRoot: os.Geteuid() == 0}
	// A temporary directory of the server's own: mariadbd removes every
	// "#sql*" file it finds in its tmpdir when it starts, so two private
	// servers sharing /tmp (one starting while another bootstraps) broke
	// each other's bootstrap ("Could not remove temporary table").
	if err := os.Mkdir(s.tmpdir(), 0o700); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	args := []string{"--no-defaults", "--datadir=" + filepath.Join(s.dir, "data"),
		"--auth-root-authentication-method=normal", "--skip-test-db", "--tmpdir=" + s.tmpdir()}
	if s.asRoot {
		args = append(args, "--user=root")
	}
	if out, err := exec.Command(installDB, args...).CombinedOutput(); err != nil {
		t.Fatalf("testenv: %s: %v: %s", installDB, err, out)
	}
	if err := s.start(); err != nil {
		t.Fatalf("testenv: start mariadbd: %v", err)
	}
	t.Cleanup(s.Kill)
	db, err := openRaw(s.config("mysql"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec("CREATE DATABASE test CHARACTER SET utf8mb4"); err != nil {
		t.Fatalf("testenv: create database test: %v", err)
	}
	return s
}

// tmpdir is the server's own temporary directory.
func (s *MySQLServer) tmpdir() string { return filepath.Join(s.dir, "tmp") }

// Config returns a driver configuration for the server's database test.
func (s *MySQLServer) Config() *mysql.Config { return s.config("test") }

func (s *MySQLServer) config(db string) *mysql.Config {
	cfg := mysql.NewConfig()
	cfg.User, cfg.Net, cfg.Addr, cfg.DBName = "root", "tcp", s.Addr(), db
	cfg.Timeout = 2 * time.Second
	return cfg
}

// Addr returns host:port.
func (s *MySQLServer) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Kill stops the server with SIGKILL and waits for it to exit. Killing a
// stopped server does nothing.
func (s *MySQLServer) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return
	}
	_ = s.proc.Signal(syscall.SIGKILL)
	<-s.exited
	s.proc = nil
}

// Restart kills the server if it runs and starts it again on the same port
// and data: InnoDB recovers every committed transaction. It may be called
// from any goroutine: a failure marks the test failed (t.Errorf) rather
// than stopping it.
func (s *MySQLServer) Restart() {
	s.Kill()
	if err := s.start(); err != nil {
		s.t.Errorf("testenv: restart mariadbd: %v", err)
	}
}

func (s *MySQLServer) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	args := []string{"--no-defaults",
		"--datadir=" + filepath.Join(s.dir, "data"),
		"--tmpdir=" + s.tmpdir(),
		"--socket=" + filepath.Join(s.dir, "mysqld.sock"),
		"--pid-file=" + filepath.Join(s.dir, "mysqld.pid"),
		"--port=" + strconv.Itoa(s.port), "--bind-address=127.0.0.1", "--skip-name-resolve",
		"--innodb-buffer-pool-size=32M", "--innodb-flush-log-at-trx-commit=1",
		"--log-error=" + filepath.Join(s.dir, "error.log"),
	}
	if s.asRoot {
		args = append(args, "--user=root")
	}
	cmd := exec.Command(s.bin, args...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(60 * time.Second) // crash recovery included, on a loaded machine
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(s.dir, "error.log"))
			return fmt.Errorf("mariadbd exited: %v: %s%s", waitErr, out.String(), tailOf(log, 2048))
		default:
		}
		if pingMySQL(s.config("mysql").FormatDSN()) == nil {
			s.proc, s.exited = cmd.Process, exited
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = cmd.Process.Kill()
	<-exited
	return errors.New("mariadbd did not answer within 60s: " + out.String())
}

// lookBinary finds a program named by the environment variable env, or
// else the first of names on PATH or in /usr/sbin.
func lookBinary(env string, names ...string) (string, error) {
	if p := os.Getenv(env); p != "" {
		return exec.LookPath(p)
	}
	var errs []error
	for _, n := range names {
		for _, p := range []string{n, filepath.Join("/usr/sbin", n)} {
			path, err := exec.LookPath(p)
			if err == nil {
				return path, nil
			}
			errs = append(errs, err)
		}
	}
	return "", errors.Join(errs...)
}

func tailOf(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// openRaw opens cfg without tying the *sql.DB to a test.
func openRaw(cfg *mysql.Config) (*sql.DB, error) {
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	return sql.OpenDB(conn), nil
}
