package etcdtest

import (
	"fmt"
	"os"
	"sync"
	"testing"
)

// The tests that need only a healthy three-member cluster share one,
// started by the first of them and stopped after the last test: starting a
// cluster takes seconds under -race. Tests that stop, restart or cut off
// members, or cut clients off through the proxies, start their own.

var shared struct {
	once   sync.Once
	c      *Cluster
	err    error
	keeper *keeper
}

// sharedCluster returns the package's shared cluster, starting it on the
// first call. It has no client proxies.
func sharedCluster(t testing.TB) *Cluster {
	t.Helper()
	if _, err := startShared(); err != nil {
		t.Fatalf("the shared cluster did not start: %v", err)
	}
	return shared.c
}

// startShared starts the shared cluster on its first call.
func startShared() (*Cluster, error) {
	shared.once.Do(func() {
		k := &keeper{}
		shared.keeper = k
		defer func() {
			if r := recover(); r != nil {
				shared.err = fmt.Errorf("%v", r)
			}
		}()
		shared.c = startClusterOf(k, 3, false)
	})
	return shared.c, shared.err
}

// keeper stands in for a test for the shared cluster: it lives until
// TestMain ends.
type keeper struct {
	mu       sync.Mutex
	dirs     []string
	cleanups []func()
}

func (k *keeper) Helper()           {}
func (k *keeper) Fatal(args ...any) { panic(fmt.Sprint(args...)) }

func (k *keeper) TempDir() string {
	d, err := os.MkdirTemp("", "etcdtest-")
	if err != nil {
		panic(err)
	}
	k.mu.Lock()
	k.dirs = append(k.dirs, d)
	k.mu.Unlock()
	return d
}

func (k *keeper) Cleanup(f func()) {
	k.mu.Lock()
	k.cleanups = append(k.cleanups, f)
	k.mu.Unlock()
}

func (k *keeper) close() {
	k.mu.Lock()
	cs, ds := k.cleanups, k.dirs
	k.mu.Unlock()
	for i := len(cs) - 1; i >= 0; i-- {
		cs[i]()
	}
	for _, d := range ds {
		os.RemoveAll(d)
	}
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.keeper != nil {
		shared.keeper.close()
	}
	os.Exit(code)
}
