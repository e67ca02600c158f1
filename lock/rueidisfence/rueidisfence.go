package rueidisfence

import (
	"errors"
	"fmt"

	"github.com/redis/rueidis"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/lockbackend"
	"github.com/fencekit/fencekit/lock"
	"github.com/fencekit/fencekit/lock/internal/redisbackend"
)

// errNoHook means package lock set no constructor hook, which its
// initialisation always does: a build that mixes module versions.
var errNoHook = errors.New("rueidisfence: this fencekit's package lock offers no backend constructor")

// New returns a Locker whose locks, fencing tokens, wait queue and leader
// records are held by the Redis deployment client talks to: a single
// server (or a Sentinel-managed master) or a Redis Cluster. It is
// lock.New on a rueidis client: the same scripts and keys, so the same
// tokens (clock-anchored, rising on every grant), the same queue and
// hand-over in the release, renewal, lock.Owner holds,
// Locker.FenceLock, Locker.Advance and the record the election keeps its
// leader in. A resource may be locked through go-redis and rueidis
// Lockers at once, with the same prefix: they share its keys.
//
// It refuses, with an error matching fence.ErrInvalid and nothing sent, a
// nil client; lock.WithNodeTimeout is Redlock's and is refused too. The
// Locker never closes client.
func New(client rueidis.Client, opts ...lock.Option) (*lock.Locker, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: rueidisfence: nil rueidis.Client", fence.ErrInvalid)
	}
	return newOn(newClient(client), opts)
}

// newOn is New on c.
func newOn(c *client, opts []lock.Option) (*lock.Locker, error) {
	return open(opts, func(s lockbackend.Settings) (lockbackend.Backend, error) {
		return redisbackend.NewOn(c, s)
	})
}

// NewRedlock returns a Locker that holds each lock on a quorum of
// independent Redis masters, one rueidis client each, as lock.NewRedlock
// does on go-redis clients (see its documentation: the token is the
// largest of the granting nodes', raised on the others; Acquire polls).
// Two clients that reach the same server (the same client, or one server's
// address) are refused, whatever database each selects, since that server
// would vote twice; so is a nil client, or none.
func NewRedlock(clients []rueidis.Client, opts ...lock.Option) (*lock.Locker, error) {
	cs := make([]redisbackend.Client, len(clients))
	for i, c := range clients {
		if c == nil {
			return nil, fmt.Errorf("%w: rueidisfence: Redlock client %d is nil", fence.ErrInvalid, i)
		}
		cs[i] = newClient(c)
	}
	return newRedlockOn(cs, opts)
}

// newRedlockOn is NewRedlock on cs, one command interface per node.
func newRedlockOn(cs []redisbackend.Client, opts []lock.Option) (*lock.Locker, error) {
	mk, err := redisbackend.NewRedlockOn(cs, lock.DefaultNodeTimeout)
	if err != nil {
		return nil, err
	}
	return open(opts, mk)
}

// open is package lock's constructor on the backend mk makes.
func open(opts []lock.Option, mk lockbackend.Opener) (*lock.Locker, error) {
	if lockbackend.Open == nil {
		return nil, errNoHook
	}
	l, err := lockbackend.Open(mk, anys(opts))
	if err != nil {
		return nil, err
	}
	return l.(*lock.Locker), nil
}

// anys returns opts as the []any a constructor hook of the root module
// takes (lockbackend.Open, rediscmd.NewStore).
func anys[T any](opts []T) []any {
	out := make([]any, len(opts))
	for i, o := range opts {
		out[i] = o
	}
	return out
}
