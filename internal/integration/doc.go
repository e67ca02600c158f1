// Package integration holds fencekit's tests that need third-party test
// tools: FenceLock against the real redsync and bsm/redislock, goroutine
// leak checks with go.uber.org/goleak, and cmd/testservers, which starts
// server containers with testcontainers-go for internal/harness/testenv.
//
// It is a module of its own, joined to the fencekit module by the
// repository's go.work, so that none of these tools becomes a requirement of
// the fencekit module and reaches the module graph of programs that use it.
// Run its tests from the repository root with
//
//	go test -race ./internal/integration/...
package integration
