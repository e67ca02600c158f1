package redis

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
)

// lostReplyStores returns two stores on the shared Redis under one prefix:
// via reaches Redis through p with go-redis's default retries, so that a
// reply p loses makes the client send the same script again; direct is
// another client's store, for the writes that land in between.
func lostReplyStores(t *testing.T, opts ...Option) (via *Store, p *testenv.Proxy, direct *Store) {
	t.Helper()
	ctx := context.Background()
	c := testenv.Redis(t)
	prefix := testenv.Prefix(t)
	direct, err := New(c, append([]Option{WithPrefix(prefix)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := direct.Preload(ctx); err != nil { // one command per call through the proxy
		t.Fatal(err)
	}
	p = testenv.StartProxy(t, c.Options().Addr)
	// One connection, opened now: the next reply the proxy sees is the
	// operation's, not a connection handshake. MaxRetries stays at its default.
	vc := goredis.NewClient(&goredis.Options{Addr: p.Addr(), DB: c.Options().DB, PoolSize: 1})
	t.Cleanup(func() { _ = vc.Close() })
	if err := vc.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	via, err = New(vc, append([]Option{WithPrefix(prefix)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return via, p, direct
}

// incr returns fn for Update and Modify that adds one to a decimal counter,
// counting its calls, and runs before (if not nil) on its first call.
func incr(calls *atomic.Int32, before func()) func(Value) ([]byte, error) {
	return func(old Value) ([]byte, error) {
		if calls.Add(1) == 1 && before != nil {
			before()
		}
		n, _ := strconv.Atoi(string(old.Data))
		return []byte(strconv.Itoa(n + 1)), nil
	}
}

// TestLostReplyReportsFirstRun loses the reply of each kind of write on a
// real connection, lets another client write the key before go-redis sends
// the write again, and checks that the call reports its first run's outcome
// and that the write was applied exactly once.
func TestLostReplyReportsFirstRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := fen(1, "a"), fen(2, "b")
	must := func(t *testing.T, err error) {
		t.Helper()
		if err != nil {
			t.Error(err) // may run on the proxy's goroutine
		}
	}
	tests := []struct {
		name string
		// run makes the call through the proxy, arming lose at the moment
		// the write is next, and returns its version; lose writes the key
		// with the other store.
		run func(t *testing.T, via, direct *Store, lose func(then func())) (int64, error)
		// want is the version the call must report; check inspects the key.
		want  int64
		check func(t *testing.T, direct *Store)
	}{
		{
			name: "Set then a newer holder's Set",
			run: func(t *testing.T, via, direct *Store, lose func(func())) (int64, error) {
				lose(func() { _, err := direct.FencedSet(ctx, b, "k", []byte("b")); must(t, err) })
				return via.FencedSet(ctx, a, "k", []byte("a"))
			},
			want:  1,
			check: wantValue("b", 2),
		},
		{
			name: "SetIfVersion then a newer holder's Set",
			run: func(t *testing.T, via, direct *Store, lose func(func())) (int64, error) {
				_, err := direct.FencedSet(ctx, a, "k", []byte("a0"))
				must(t, err)
				lose(func() { _, err := direct.FencedSet(ctx, b, "k", []byte("b")); must(t, err) })
				return via.FencedSetIfVersion(ctx, a, "k", 1, []byte("a1"))
			},
			want:  2,
			check: wantValue("b", 3),
		},
		{
			name: "Delete then a compare-and-set",
			run: func(t *testing.T, via, direct *Store, lose func(func())) (int64, error) {
				_, err := direct.FencedSet(ctx, a, "k", []byte("a0"))
				must(t, err)
				lose(func() { _, err := direct.CompareAndSet(ctx, "k", 2, []byte("new")); must(t, err) })
				return 2, via.FencedDelete(ctx, a, "k")
			},
			want:  2,
			check: wantValue("new", 3),
		},
		{
			name: "CompareAndSet then one built on it",
			run: func(t *testing.T, via, direct *Store, lose func(func())) (int64, error) {
				lose(func() { _, err := direct.CompareAndSet(ctx, "k", 1, []byte("b")); must(t, err) })
				return via.CompareAndSet(ctx, "k", 0, []byte("a"))
			},
			want:  1,
			check: wantValue("b", 2),
		},
		{
			name: "CompareAndDelete then a compare-and-set",
			run: func(t *testing.T, via, direct *Store, lose func(func())) (int64, error) {
				_, err := direct.CompareAndSet(ctx, "k", 0, []byte("a"))
				must(t, err)
				lose(func() { _, err := direct.CompareAndSet(ctx, "k", 2, []byte("b")); must(t, err) })
				return via.CompareAndDelete(ctx, "k", 1)
			},
			want:  2,
			check: wantValue("b", 3),
		},
		{
			name: "Modify then another Modify",
			run: func(t *testing.T, via, direct *Store, lose func(func())) (int64, error) {
				var calls, other atomic.Int32
				v, err := via.Modify(ctx, "k", 5, incr(&calls, func() {
					lose(func() { _, err := direct.Modify(ctx, "k", 5, incr(&other, nil)); must(t, err) })
				}))
				if n := calls.Load(); n != 1 {
					t.Errorf("Modify ran fn %d times; want once", n)
				}
				return v.Version, err
			},
			want:  1,
			check: wantValue("2", 2),
		},
		{
			name: "Update then a newer holder's Update",
			run: func(t *testing.T, via, direct *Store, lose func(func())) (int64, error) {
				var calls, other atomic.Int32
				v, err := via.FencedUpdate(ctx, a, "k", incr(&calls, func() {
					lose(func() { _, err := direct.FencedUpdate(ctx, b, "k", incr(&other, nil)); must(t, err) })
				}))
				if n := calls.Load(); n != 1 {
					t.Errorf("Update ran fn %d times; want once", n)
				}
				return v.Version, err
			},
			want:  1,
			check: wantValue("2", 2),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			via, p, direct := lostReplyStores(t)
			var lost atomic.Bool
			lose := func(then func()) {
				p.LoseNextReply(func() { then(); lost.Store(true) })
			}
			v, err := tt.run(t, via, direct, lose)
			if !lost.Load() {
				t.Fatal("no reply was lost; the test did not exercise a retry")
			}
			if err != nil || v != tt.want {
				t.Fatalf("call whose reply was lost = %d, %v; want %d, <nil> (its first run's outcome)", v, err, tt.want)
			}
			tt.check(t, direct)
		})
	}
}

// wantValue checks that the key holds data at version ver: each write
// applied once.
func wantValue(data string, ver int64) func(*testing.T, *Store) {
	return func(t *testing.T, s *Store) {
		t.Helper()
		v, err := s.Load(context.Background(), "k")
		if err != nil || string(v.Data) != data || v.Version != ver {
			t.Fatalf("key holds %q at version %d (%v); want %q at version %d", v.Data, v.Version, err, data, ver)
		}
	}
}

// TestLostReplyOfRefusal checks that a refused write whose reply is lost is
// still refused when the client retries it: refusals change nothing, so
// running them again gives the same answer.
func TestLostReplyOfRefusal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	via, p, direct := lostReplyStores(t)
	if _, err := direct.FencedSet(ctx, fen(2, "b"), "k", []byte("b")); err != nil {
		t.Fatal(err)
	}
	p.LoseNextReply(nil)
	if _, err := via.FencedSet(ctx, fen(1, "a"), "k", []byte("a")); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("stale Set whose reply was lost = %v; want ErrStale", err)
	}
	p.LoseNextReply(nil)
	if _, err := via.CompareAndSet(ctx, "k", 0, []byte("a")); !errors.Is(err, fence.ErrConflict) {
		t.Fatalf("conflicting CompareAndSet whose reply was lost = %v; want ErrConflict", err)
	}
	wantValue("b", 1)(t, direct)
}

// TestShorterWindowKeepsOthersRecords loses the reply of a Modify through a
// store with the client's full window, lets a store with a 1 s window write
// the same key 1.1 s later, and checks that go-redis's resend still finds
// its record: a store never drops another store's record, so the counter
// ends at 2, each increment applied once.
func TestShorterWindowKeepsOthersRecords(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	via, p, _ := lostReplyStores(t)
	short, err := New(noRetryClient(t), WithPrefix(via.Prefix()), WithRetryWindow(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var calls, other atomic.Int32
	var lost atomic.Bool
	v, err := via.Modify(ctx, "k", 5, incr(&calls, func() {
		p.LoseNextReply(func() {
			time.Sleep(1100 * time.Millisecond)
			if _, err := short.Modify(ctx, "k", 5, incr(&other, nil)); err != nil {
				t.Error(err)
			}
			lost.Store(true)
		})
	}))
	if !lost.Load() {
		t.Fatal("no reply was lost; the test did not exercise a retry")
	}
	if err != nil || v.Version != 1 || calls.Load() != 1 {
		t.Fatalf("Modify whose reply was lost = version %d, %v after %d runs of fn; want version 1, <nil>, 1 run", v.Version, err, calls.Load())
	}
	wantValue("2", 2)(t, short)
}

// TestLostReplyOfRaisingGet loses the reply of a fenced Get that raised the
// key's mark, lets other clients act before go-redis sends it again, and
// checks that the Get never reports a refusal: its first run was admitted.
// It answers as that run did while the value is as that run saw it, and
// with an unknown outcome once the value has changed.
func TestLostReplyOfRaisingGet(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	old, a, b := fen(1, "old"), fen(2, "a"), fen(3, "b")
	tests := []struct {
		name    string
		between func(direct *Store) error
		want    string // "" for ErrOutcomeUnknown
	}{
		{"nothing in between", func(*Store) error { return nil }, "v"},
		{"a newer holder's Get", func(d *Store) error { _, err := d.FencedGet(ctx, b, "k"); return err }, "v"},
		{"a newer holder's Set", func(d *Store) error { _, err := d.FencedSet(ctx, b, "k", []byte("w")); return err }, ""},
		{"a compare-and-set", func(d *Store) error { _, err := d.CompareAndSet(ctx, "k", 1, []byte("w")); return err }, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			via, p, direct := lostReplyStores(t)
			if _, err := direct.FencedSet(ctx, old, "k", []byte("v")); err != nil {
				t.Fatal(err)
			}
			var lost atomic.Bool
			p.LoseNextReply(func() {
				if err := tt.between(direct); err != nil {
					t.Error(err)
				}
				lost.Store(true)
			})
			v, err := via.FencedGet(ctx, a, "k")
			if !lost.Load() {
				t.Fatal("no reply was lost; the test did not exercise a retry")
			}
			if errors.Is(err, fence.ErrStale) {
				t.Fatalf("Get whose first run raised the mark reports a refusal: %v", err)
			}
			if tt.want == "" {
				if !errors.Is(err, fence.ErrOutcomeUnknown) {
					t.Fatalf("Get after the value changed = %q, %v; want ErrOutcomeUnknown", v.Data, err)
				}
				return
			}
			if err != nil || string(v.Data) != tt.want || v.Version != 1 {
				t.Fatalf("Get = %q at version %d, %v; want %q at version 1 (its first run's read)", v.Data, v.Version, err, tt.want)
			}
		})
	}
}

// TestOutcomeUnknownAfterSend ends a call's context, or breaks its
// connection, after its script ran and before its reply arrived, and checks
// that the call says its outcome is unknown (and still matches the cause),
// never that nothing was applied.
func TestOutcomeUnknownAfterSend(t *testing.T) {
	t.Parallel()
	calls := map[string]func(ctx context.Context, s *Store) error{
		"Set": func(ctx context.Context, s *Store) error {
			_, err := s.FencedSet(ctx, fen(1, "a"), "k", []byte("x"))
			return err
		},
		"Delete": func(ctx context.Context, s *Store) error { return s.FencedDelete(ctx, fen(1, "a"), "k") },
		"Get":    func(ctx context.Context, s *Store) error { _, err := s.FencedGet(ctx, fen(1, "a"), "k"); return err },
		"CompareAndSet": func(ctx context.Context, s *Store) error {
			_, err := s.CompareAndSet(ctx, "k", 0, []byte("x"))
			return err
		},
		"CompareAndDelete": func(ctx context.Context, s *Store) error {
			_, err := s.CompareAndDelete(ctx, "k", 0)
			return err
		},
	}
	for name, call := range calls {
		t.Run(name+" whose context ends", func(t *testing.T) {
			via, p, _ := lostReplyStores(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			p.LoseNextReply(cancel)
			err := call(ctx, via)
			if !errors.Is(err, fence.ErrOutcomeUnknown) || !errors.Is(err, context.Canceled) {
				t.Fatalf("%s = %v; want an error matching ErrOutcomeUnknown and context.Canceled", name, err)
			}
		})
		t.Run(name+" whose connection breaks", func(t *testing.T) {
			via, p, _ := lostReplyStores(t)
			nc := goredis.NewClient(&goredis.Options{Addr: p.Addr(), MaxRetries: -1})
			t.Cleanup(func() { _ = nc.Close() })
			noRetry, err := New(nc, WithPrefix(via.Prefix()))
			if err != nil {
				t.Fatal(err)
			}
			if err := noRetry.Preload(context.Background()); err != nil {
				t.Fatal(err)
			}
			p.LoseNextReply(nil)
			if err := call(context.Background(), noRetry); !errors.Is(err, fence.ErrOutcomeUnknown) {
				t.Fatalf("%s = %v; want an error matching ErrOutcomeUnknown", name, err)
			}
		})
	}
}

// TestNothingSentIsNotUnknown checks that calls that surely did not run keep
// saying so: a server nobody can reach, a server that resets every
// connection before the command is written, an ended context, and an error
// reply to the only send.
func TestNothingSentIsNotUnknown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	check := func(t *testing.T, what string, s *Store) {
		t.Helper()
		_, err := s.FencedSet(ctx, fen(1, "a"), "k", []byte("x"))
		if err == nil || errors.Is(err, fence.ErrOutcomeUnknown) {
			t.Fatalf("Set %s = %v; want an error that does not say the outcome is unknown", what, err)
		}
	}
	t.Run("unreachable", func(t *testing.T) {
		c := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"})
		t.Cleanup(func() { _ = c.Close() })
		s, err := New(c)
		if err != nil {
			t.Fatal(err)
		}
		check(t, "on an unreachable server", s)
	})
	t.Run("reset before the command", func(t *testing.T) {
		p := testenv.StartProxy(t, testenv.Redis(t).Options().Addr)
		p.CutFor(time.Hour)
		c := goredis.NewClient(&goredis.Options{Addr: p.Addr()})
		t.Cleanup(func() { _ = c.Close() })
		s, err := New(c)
		if err != nil {
			t.Fatal(err)
		}
		check(t, "on connections reset before the command", s)
	})
	t.Run("ended context", func(t *testing.T) {
		s, _ := newStore(t)
		ctx, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := s.FencedSet(ctx, fen(1, "a"), "k", nil); !errors.Is(err, context.Canceled) || errors.Is(err, fence.ErrOutcomeUnknown) {
			t.Fatalf("Set with an ended context = %v; want context.Canceled alone", err)
		}
	})
	t.Run("error reply", func(t *testing.T) {
		srv := testenv.StartRedis(t)
		c := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
		t.Cleanup(func() { _ = c.Close() })
		s, err := New(c)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Preload(ctx); err != nil {
			t.Fatal(err)
		}
		// Out of memory: the script's first write is refused, so nothing
		// changes, and the server says so.
		if err := c.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
			t.Fatal(err)
		}
		check(t, "refused for memory", s)
		if n := c.DBSize(ctx).Val(); n != 0 {
			t.Fatalf("%d keys after a refused Set", n)
		}
	})
}

// TestLostReplyThroughAWrapper is TestLostReplyReportsFirstRun's first case
// through a client whose options the store cannot read: every send of it
// looks for its record, so the retry still reports the first run.
func TestLostReplyThroughAWrapper(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	via, p, direct := lostReplyStores(t)
	wrapped, err := New(scripter{via.client.(*goRedis).c}, WithPrefix(via.Prefix()))
	if err != nil {
		t.Fatal(err)
	}
	var lost atomic.Bool
	p.LoseNextReply(func() {
		if _, err := direct.FencedSet(ctx, fen(2, "b"), "k", []byte("b")); err != nil {
			t.Error(err)
		}
		lost.Store(true)
	})
	v, err := wrapped.FencedSet(ctx, fen(1, "a"), "k", []byte("a"))
	if !lost.Load() {
		t.Fatal("no reply was lost; the test did not exercise a retry")
	}
	if err != nil || v != 1 {
		t.Fatalf("Set whose reply was lost = %d, %v; want 1, <nil>", v, err)
	}
	wantValue("b", 2)(t, direct)
}
