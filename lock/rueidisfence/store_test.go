package rueidisfence

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/redisstoresuite"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	fkredis "github.com/fencekit/fencekit/storage/redis"
)

// newStore is NewStore on c, failing t on an error.
func newStore(t testing.TB, c rueidis.Client, opts ...fkredis.Option) *fkredis.Store {
	t.Helper()
	s, err := NewStore(c, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestStoreSuite runs the store's shared suite on a rueidis client of
// one server.
func TestStoreSuite(t *testing.T) {
	t.Parallel()
	redisstoresuite.Run(t, redisstoresuite.Target{
		Open: func(t *testing.T, opts ...fkredis.Option) (*fkredis.Store, redis.UniversalClient) {
			return newStore(t, rueidisClient(t, sharedAddr(t)), opts...), testenv.Redis(t)
		},
	})
}

// TestStoreCluster runs the suite on a rueidis client of a Redis Cluster
// of three masters, and checks that a caller's hash tag decides the slot
// as on go-redis, that a go-redis store with the same prefix reads what
// the rueidis store wrote, and that a slot moving to another master (the
// client follows ASK and MOVED) keeps the mark.
func TestStoreCluster(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	cl := testenv.StartCluster(t, 3, 0)
	cc := cl.Client()
	rc := rueidisClient(t, cl.Nodes[0].Addr())
	if rc.Mode() != rueidis.ClientModeCluster {
		t.Fatalf("client mode %v, want a cluster client", rc.Mode())
	}
	redisstoresuite.Run(t, redisstoresuite.Target{
		Open: func(t *testing.T, opts ...fkredis.Option) (*fkredis.Store, redis.UniversalClient) {
			return newStore(t, rc, opts...), cc
		},
	})

	ctx := ctxFor(t, time.Minute)
	prefix := testenv.Prefix(t) + "store-"
	s := newStore(t, rc, fkredis.WithPrefix(prefix))
	g, err := fkredis.New(cc, fkredis.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	const key = "{user42}:cart"
	if got, want := cc.ClusterKeySlot(ctx, prefix+key).Val(), cc.ClusterKeySlot(ctx, "{user42}").Val(); got != want {
		t.Fatalf("stored key in slot %d, want the caller's tag slot %d", got, want)
	}
	newer, older := fence.Fence{Resource: "r", Token: 5, Holder: "new"}, fence.Fence{Resource: "r", Token: 3, Holder: "old"}
	if _, err := s.FencedSet(ctx, newer, key, []byte("v1")); err != nil {
		t.Fatal(err)
	}
	if v, err := g.FencedGet(ctx, newer, key); err != nil || string(v.Data) != "v1" || v.Version != 1 {
		t.Fatalf("go-redis store reads %+v, %v; want v1 at version 1", v, err)
	}
	if _, _, err := cl.MoveSlot(ctx, prefix+key); err != nil {
		t.Fatal(err)
	}
	if _, err := s.FencedSet(ctx, older, key, []byte("late")); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("stale write after the slot moved: %v; want ErrStale", err)
	}
	if ver, err := s.FencedSet(ctx, newer, key, []byte("v2")); err != nil || ver != 2 {
		t.Fatalf("write after the slot moved = %d, %v; want 2", ver, err)
	}
}

// TestStoreRefusesBadInput: a nil client and invalid options are refused
// with fence.ErrInvalid; a retry window below go-redis's default horizon
// is accepted, since a rueidis client's options cannot be read.
func TestStoreRefusesBadInput(t *testing.T) {
	if _, err := NewStore(nil); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("NewStore(nil) = %v, want fence.ErrInvalid", err)
	}
	c := rueidisClient(t, sharedAddr(t))
	for name, opt := range map[string]fkredis.Option{
		"nil option":      nil,
		"empty prefix":    fkredis.WithPrefix(""),
		"window below 1s": fkredis.WithRetryWindow(time.Millisecond),
	} {
		if _, err := NewStore(c, opt); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("%s: %v, want fence.ErrInvalid", name, err)
		}
	}
	if _, err := NewStore(c, fkredis.WithRetryWindow(10*time.Second)); err != nil {
		t.Errorf("a 10 s retry window: %v", err)
	}
}

// lostReplyStores returns a store on a rueidis client that reaches the
// shared Redis through p, and a go-redis store of the same keys for the
// writes that land in between. The rueidis client's connections are made
// and used before it returns, so that the next reply the proxy sees is
// the one of the next call.
// wrap, if not nil, stands between the store and the rueidis client.
func lostReplyStores(t *testing.T, wrap func(rueidis.Client) rueidis.Client) (via *fkredis.Store, p *testenv.Proxy, direct *fkredis.Store) {
	t.Helper()
	ctx := ctxFor(t, time.Minute)
	c := testenv.Redis(t)
	prefix := testenv.Prefix(t) + "store-"
	direct, err := fkredis.New(c, fkredis.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	if err := direct.Preload(ctx); err != nil { // one command per call through the proxy
		t.Fatal(err)
	}
	p = testenv.StartProxy(t, c.Options().Addr)
	rc, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress: []string{p.Addr()}, DisableCache: true, SelectDB: c.Options().DB,
		PipelineMultiplex: -1, // one connection for every call
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close)
	if wrap != nil {
		rc = wrap(rc)
	}
	via = newStore(t, rc, fkredis.WithPrefix(prefix))
	for range 3 {
		if _, err := via.Load(ctx, "k"); !errors.Is(err, fence.ErrNotFound) {
			t.Fatal(err)
		}
	}
	return via, p, direct
}

// resending is a rueidis client that sends a command again after an
// error other than a reply, as rueidis itself does with a connection whose
// ConnLifetime ended with the reply still due.
type resending struct{ rueidis.Client }

func (c resending) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	res := c.Client.Do(ctx, cmd)
	if res.NonRedisError() != nil && ctx.Err() == nil {
		res = c.Client.Do(ctx, cmd)
	}
	return res
}

// TestStoreLostReply loses the reply of a fenced write on the rueidis
// client's connection while another holder writes the key. rueidis does
// not send a script again after a network error, so the write reports an
// unknown outcome (not a failure); through a client that does send it
// again, the resend finds the first run's retry record and reports its
// outcome. Either way the write was applied once.
func TestStoreLostReply(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		wrap  func(rueidis.Client) rueidis.Client
		check func(t *testing.T, ver int64, err error)
	}{
		{"rueidis", nil, func(t *testing.T, _ int64, err error) {
			if !errors.Is(err, fence.ErrOutcomeUnknown) {
				t.Fatalf("a write whose reply was lost = %v; want fence.ErrOutcomeUnknown", err)
			}
		}},
		{"a client that sends it again", func(c rueidis.Client) rueidis.Client { return resending{c} }, func(t *testing.T, ver int64, err error) {
			if err != nil || ver != 1 {
				t.Fatalf("a write sent again after its reply was lost = %d, %v; want its first run's 1, <nil>", ver, err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ctxFor(t, time.Minute)
			via, p, direct := lostReplyStores(t, tc.wrap)
			p.LoseNextReply(func() {
				if _, err := direct.FencedSet(ctx, fence.Fence{Resource: "r", Token: 2, Holder: "b"}, "k", []byte("b")); err != nil {
					t.Error(err)
				}
			})
			ver, err := via.FencedSet(ctx, fence.Fence{Resource: "r", Token: 1, Holder: "a"}, "k", []byte("a"))
			if p.Faults().Lost == 0 {
				t.Fatal("no reply was lost; the test did not exercise one")
			}
			tc.check(t, ver, err)
			wantValue(t, direct, "b", 2)
		})
	}
}

// wantValue fails t unless s holds data at version ver for "k".
func wantValue(t *testing.T, s *fkredis.Store, data string, ver int64) {
	t.Helper()
	v, err := s.Load(context.Background(), "k")
	if err != nil || string(v.Data) != data || v.Version != ver {
		t.Fatalf("k holds %+v, %v; want %q at version %d (applied once)", v, err, data, ver)
	}
}
