package etcdtest

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"go.etcd.io/etcd/client/v3/snapshot"
	etcdutl "go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"
)

// Backup saves a snapshot of the cluster's data, through member i, to a
// file of the test's own, as `etcdctl snapshot save` does, and returns its
// path.
func (c *Cluster) Backup(t testing.TB, i int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "backup.db")
	if err := c.backup(i, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// backup is Backup to path, for a caller off the test's goroutine.
func (c *Cluster) backup(i int, path string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := clientConfig(c.Members[i].DirectURL())
	cfg.Context = ctx
	if _, err := snapshot.SaveWithVersion(ctx, zap.NewNop(), cfg, path); err != nil {
		return fmt.Errorf("etcdtest: snapshot save: %w", err)
	}
	return nil
}

// Restore stops every member and starts the cluster again from the
// snapshot at path, as an operator restores a cluster from a backup with
// `etcdutl snapshot restore` into new data directories: same names, same
// peer and client addresses, so clients of the old cluster reach the new
// one. bump is restore's --bump-revision (with --mark-compacted when it is
// not 0).
func (c *Cluster) Restore(t testing.TB, path string, bump uint64) {
	t.Helper()
	dirs := make([]string, len(c.Members))
	for i := range dirs {
		dirs[i] = t.TempDir()
	}
	if err := c.restore(path, bump, dirs); err != nil {
		t.Fatal(err)
	}
}

// restore is Restore into the data directories dirs (one per member, each
// new), for a caller off the test's goroutine.
func (c *Cluster) restore(path string, bump uint64, dirs []string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.Members {
		m.stop()
	}
	for i, m := range c.Members {
		m.dir = dirs[i]
		err := etcdutl.NewV3(zap.NewNop()).Restore(etcdutl.RestoreConfig{
			SnapshotPath:        path,
			Name:                m.Name,
			OutputDataDir:       filepath.Join(m.dir, "restored"),
			PeerURLs:            []string{m.advertise},
			InitialCluster:      m.initial,
			InitialClusterToken: "fencekit-etcdtest",
			RevisionBump:        bump,
			MarkCompacted:       bump != 0,
		})
		if err != nil {
			return fmt.Errorf("etcdtest: snapshot restore of %s: %w", m.Name, err)
		}
		m.dir = filepath.Join(m.dir, "restored")
	}
	errs := make(chan error, len(c.Members))
	for _, m := range c.Members {
		go func() {
			var err error
			for range 50 { // the ports may take a moment to be free again
				if err = m.start(); err == nil {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			errs <- err
		}()
	}
	var first error
	for range c.Members {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// waitLeader waits up to d for a member to lead, for a caller off the
// test's goroutine.
func (c *Cluster) waitLeader(d time.Duration) error {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		c.mu.Lock()
		for _, m := range c.Members {
			if m.etcd != nil && m.etcd.Server.Leader() != 0 && m.etcd.Server.Leader() == m.etcd.Server.MemberID() {
				c.mu.Unlock()
				return nil
			}
		}
		c.mu.Unlock()
	}
	return fmt.Errorf("etcdtest: no leader after %v", d)
}
