package etcdtest

import (
	"context"
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
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := clientConfig(c.Members[i].DirectURL())
	cfg.Context = ctx
	if _, err := snapshot.SaveWithVersion(ctx, zap.NewNop(), cfg, path); err != nil {
		t.Fatalf("etcdtest: snapshot save: %v", err)
	}
	return path
}

// Restore stops every member and starts the cluster again from the
// snapshot at path, as an operator restores a cluster from a backup with
// `etcdutl snapshot restore` into new data directories: same names, same
// peer and client addresses, so clients of the old cluster reach the new
// one. bump is restore's --bump-revision (with --mark-compacted when it is
// not 0).
func (c *Cluster) Restore(t testing.TB, path string, bump uint64) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.Members {
		m.stop()
	}
	for _, m := range c.Members {
		m.dir = t.TempDir()
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
			t.Fatalf("etcdtest: snapshot restore of %s: %v", m.Name, err)
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
	for range c.Members {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}
