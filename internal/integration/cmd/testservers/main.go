// Command testservers starts a Redis, PostgreSQL or MariaDB container for
// fencekit's tests, prints its URL (for MariaDB, a go-sql-driver DSN) on one
// line, and removes the container when its standard input closes.
//
//	go run ./cmd/testservers redis|postgres|mysql   (from internal/integration)
//
// internal/harness/testenv runs it when no server answers at FENCEKIT_TEST_REDIS,
// FENCEKIT_TEST_POSTGRES or FENCEKIT_TEST_MYSQL or on the default local ports, and a Docker engine
// answers. It lives in this module so that testcontainers-go and the Docker
// client stay out of the fencekit module's requirements, and so out of the
// module graph of every program that depends on fencekit.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "testservers:", err)
		os.Exit(1)
	}
}

// run starts the container args name, writes its URL to stdout, and removes
// it once stdin reaches EOF or ctx ends.
func run(ctx context.Context, args []string, stdin io.Reader, stdout io.Writer) error {
	if len(args) != 1 {
		return errors.New("usage: testservers redis|postgres|mysql")
	}
	start, ok := servers[args[0]]
	if !ok {
		return fmt.Errorf("unknown server %q (want redis, postgres or mysql)", args[0])
	}
	startCtx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if err := dockerHealthy(startCtx); err != nil {
		return err
	}
	c, url, err := start(startCtx)
	if c != nil {
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_ = c.Terminate(ctx)
		}()
	}
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintln(stdout, url); err != nil {
		return err
	}
	eof := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, stdin)
		close(eof)
	}()
	select {
	case <-eof:
	case <-ctx.Done():
	}
	return nil
}

var servers = map[string]func(context.Context) (testcontainers.Container, string, error){
	"redis":    redisContainer,
	"postgres": postgresContainer,
	"mysql":    mariadbContainer,
}

func dockerHealthy(ctx context.Context) error {
	p, err := testcontainers.NewDockerProvider()
	if err != nil {
		return fmt.Errorf("docker engine: %w", err)
	}
	defer p.Close()
	if err := p.Health(ctx); err != nil {
		return fmt.Errorf("docker engine: %w", err)
	}
	return nil
}

func redisContainer(ctx context.Context) (testcontainers.Container, string, error) {
	c, err := testcontainers.Run(ctx, "redis:7-alpine",
		testcontainers.WithExposedPorts("6379/tcp"),
		testcontainers.WithWaitStrategy(wait.ForListeningPort("6379/tcp")),
	)
	if err != nil {
		return c, "", fmt.Errorf("redis container: %w", err)
	}
	ep, err := c.PortEndpoint(ctx, "6379/tcp", "")
	if err != nil {
		return c, "", fmt.Errorf("redis container: %w", err)
	}
	return c, "redis://" + ep + "/0", nil
}

func postgresContainer(ctx context.Context) (testcontainers.Container, string, error) {
	c, err := testcontainers.Run(ctx, "postgres:15-alpine",
		testcontainers.WithExposedPorts("5432/tcp"),
		testcontainers.WithEnv(map[string]string{
			"POSTGRES_HOST_AUTH_METHOD": "trust",
			"POSTGRES_DB":               "test",
		}),
		testcontainers.WithWaitStrategy(
			wait.ForLog("database system is ready to accept connections").WithOccurrence(2),
			wait.ForListeningPort("5432/tcp"),
		),
	)
	if err != nil {
		return c, "", fmt.Errorf("postgres container: %w", err)
	}
	ep, err := c.PortEndpoint(ctx, "5432/tcp", "")
	if err != nil {
		return c, "", fmt.Errorf("postgres container: %w", err)
	}
	return c, "postgres://postgres@" + ep + "/test?sslmode=disable", nil
}

func mariadbContainer(ctx context.Context) (testcontainers.Container, string, error) {
	c, err := testcontainers.Run(ctx, "mariadb:10.11",
		testcontainers.WithExposedPorts("3306/tcp"),
		testcontainers.WithEnv(map[string]string{
			"MARIADB_ALLOW_EMPTY_ROOT_PASSWORD": "1",
			"MARIADB_DATABASE":                  "test",
		}),
		// The image's entrypoint runs a server once to initialise the data
		// directory, then the real one: wait for the second.
		testcontainers.WithWaitStrategy(
			wait.ForLog("ready for connections").WithOccurrence(2),
			wait.ForListeningPort("3306/tcp"),
		),
	)
	if err != nil {
		return c, "", fmt.Errorf("mariadb container: %w", err)
	}
	ep, err := c.PortEndpoint(ctx, "3306/tcp", "")
	if err != nil {
		return c, "", fmt.Errorf("mariadb container: %w", err)
	}
	return c, "root@tcp(" + ep + ")/test", nil
}
