package testenv

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

// Containers are started at most once per test binary and removed by
// testcontainers' reaper when the binary exits.

func dockerHealthy(ctx context.Context) error {
	p, err := testcontainers.NewDockerProvider()
	if err != nil {
		return err
	}
	defer p.Close()
	if err := p.Health(ctx); err != nil {
		return fmt.Errorf("docker engine: %w", err)
	}
	return nil
}

func redisContainer() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := dockerHealthy(ctx); err != nil {
		return "", err
	}
	c, err := testcontainers.Run(ctx, "redis:7-alpine",
		testcontainers.WithExposedPorts("6379/tcp"),
		testcontainers.WithWaitStrategy(wait.ForListeningPort("6379/tcp")),
	)
	if err != nil {
		return "", err
	}
	ep, err := c.PortEndpoint(ctx, "6379/tcp", "")
	if err != nil {
		return "", err
	}
	return "redis://" + ep + "/0", nil
}

func postgresContainer() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := dockerHealthy(ctx); err != nil {
		return "", err
	}
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
		return "", err
	}
	ep, err := c.PortEndpoint(ctx, "5432/tcp", "")
	if err != nil {
		return "", err
	}
	if ep == "" {
		return "", errors.New("container has no endpoint")
	}
	return "postgres://postgres@" + ep + "/test?sslmode=disable", nil
}
