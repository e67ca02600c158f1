package etcdtest

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/lockbackend"
	"github.com/fencekit/fencekit/lock/etcdlock/internal/backend"
)

// newBackend makes an etcd backend on cli under a prefix of the test's own.
func newBackend(t testing.TB, cli *clientv3.Client) *backend.Backend {
	t.Helper()
	return newBackendPrefix(t, cli, "fk-"+fence.NewHolder()[:8]+":")
}

// newBackendAt makes a second backend on cli, on the locks of like.
func newBackendAt(t testing.TB, cli *clientv3.Client, like *backend.Backend) *backend.Backend {
	t.Helper()
	return newBackendPrefix(t, cli, like.Prefix())
}

func newBackendPrefix(t testing.TB, cli *clientv3.Client, prefix string) *backend.Backend {
	t.Helper()
	b, err := backend.New(cli, lockbackend.Settings{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close(time.Now().Add(5 * time.Second)) })
	return b
}

func ctxFor(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func req(resource string, ttl time.Duration) *lockbackend.Request {
	return &lockbackend.Request{Resource: resource, TTL: ttl, Holder: fence.NewHolder(), Ordered: true}
}

// mustGrant tries once and fails the test unless the try is granted.
func mustGrant(t testing.TB, b *backend.Backend, r *lockbackend.Request) lockbackend.Outcome {
	t.Helper()
	out, err := b.Try(ctxFor(t, 10*time.Second), r)
	if err != nil {
		t.Fatalf("Try %q: %v", r.Resource, err)
	}
	if !out.Granted {
		t.Fatalf("Try %q: refused", r.Resource)
	}
	return out
}
