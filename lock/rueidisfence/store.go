package rueidisfence

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/rueidis"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/rediscmd"
	fkredis "github.com/fencekit/fencekit/storage/redis"
)

// errNoStoreHook means package storage/redis set no constructor hook,
// which its initialisation always does: a build that mixes module
// versions.
var errNoStoreHook = errors.New("rueidisfence: this fencekit's storage/redis offers no store constructor")

// NewStore returns the fenced store of package storage/redis (fkredis)
// on a rueidis client: the same scripts, keys, high-water marks, versions
// and retry records as fkredis.New on go-redis, so go-redis and rueidis
// stores with the same prefix share their values. client may be a single
// server's, a Sentinel master's or a Redis Cluster's; on a Cluster, a hash
// tag in a key decides its slot as on go-redis. It refuses, with an error
// matching fence.ErrInvalid and nothing sent, a nil client and invalid
// options. The Store never closes client.
//
// Retries: after a network error or a timeout, rueidis sends a command
// again only if it marks the command retryable (the read-only ones); the
// store's EVALSHA and EVAL are not, so a script whose reply was lost
// reaches the caller as an error matching fence.ErrOutcomeUnknown, where
// go-redis would have sent it again and reported its first run's outcome.
// rueidis does send any command again in two cases: one refused with
// MOVED or ASK (it ran nowhere), and one handed the error of a connection
// that has outlived ClientOption.ConnLifetime, which it resends whether or
// not the command had been written. A wrapper of the client (a hook of
// one's own) may resend too, and the store can read neither a rueidis
// client's options nor what a wrapper does. So every run looks for its
// call's retry record first (a resent write reports its first run's
// outcome, as on go-redis), records are kept for
// fkredis.DefaultRetryWindow unless fkredis.WithRetryWindow sets another
// window (any from fkredis.MinRetryWindow is accepted: choose it above
// the longest time a resend may follow its first run), and any error
// other than the script's own reply is an unknown outcome, since rueidis
// does not say how often it sent the command.
//
// Calls end by their context's deadline: rueidis ends them itself.
func NewStore(client rueidis.Client, opts ...fkredis.Option) (*fkredis.Store, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: rueidisfence: nil rueidis.Client", fence.ErrInvalid)
	}
	return newStoreOn(newClient(client), opts)
}

// newStoreOn is NewStore on c.
func newStoreOn(c *client, opts []fkredis.Option) (*fkredis.Store, error) {
	if rediscmd.NewStore == nil {
		return nil, errNoStoreHook
	}
	s, err := rediscmd.NewStore(c, anys(opts))
	if err != nil {
		return nil, err
	}
	return s.(*fkredis.Store), nil
}

var _ rediscmd.StoreClient = (*client)(nil)

// Load loads src into every server the client knows (every node of a
// Cluster, replicas included, so that a replica promoted later has it).
func (c *client) Load(ctx context.Context, src string) error {
	for addr, n := range c.c.Nodes() {
		if err := n.Do(ctx, n.B().ScriptLoad().Script(src).Build()).Error(); err != nil {
			return fmt.Errorf("rueidisfence: load a script on %s: %w", addr, err)
		}
	}
	return nil
}
