package etcdlock

import (
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/lockbackend"
	"github.com/fencekit/fencekit/lock"
	"github.com/fencekit/fencekit/lock/etcdlock/internal/backend"
)

// TokenBase is added to a holder key's create revision to make an etcd
// lock's token: 2^52, above the clock-anchored tokens of the Redis and
// PostgreSQL locks (microseconds since 1970, below 2^52 until 2112).
const TokenBase = backend.TokenBase

// ErrRevisionWentBack means the cluster answered a Locker with a revision
// below one it had answered it with before: it was restored from a backup
// without --bump-revision (see the package doc), so its tokens would
// repeat ones already issued. The Locker then grants no token at or below
// the highest revision it saw, and every lease it held before has ended.
// Restore again from the backup with --bump-revision and --mark-compacted.
var ErrRevisionWentBack = backend.ErrRevisionWentBack

// errNoHook means package lock set no constructor hook, which its
// initialisation always does: a build that mixes module versions.
var errNoHook = errors.New("etcdlock: this fencekit's package lock offers no backend constructor")

// New returns a Locker whose locks, tokens and leader records are held by
// the etcd cluster cli talks to: tokens are consensus values (TokenBase
// plus the grant's create revision) that never go back, leases are etcd
// leases the server expires, and waiters queue in arrival order, woken by
// a watch.
//
// It refuses, with an error matching fence.ErrInvalid and nothing sent, a
// nil client and options that mean nothing on etcd (lock.WithTokenRetention,
// lock.WithNodeTimeout). The Locker never closes cli.
func New(client *clientv3.Client, opts ...lock.Option) (*lock.Locker, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: etcdlock: nil *clientv3.Client", fence.ErrInvalid)
	}
	if lockbackend.Open == nil {
		return nil, errNoHook
	}
	anyOpts := make([]any, len(opts))
	for i, o := range opts {
		anyOpts[i] = o
	}
	l, err := lockbackend.Open(func(s lockbackend.Settings) (lockbackend.Backend, error) {
		return backend.New(client, s)
	}, anyOpts)
	if err != nil {
		return nil, err
	}
	return l.(*lock.Locker), nil
}
