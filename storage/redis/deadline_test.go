package redis

import (
	"context"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
)

// With a client made with go-redis's default options (ContextTimeoutEnabled
// off: reads end only at the 5 s read timeout), every call of the store
// returns by its context's deadline when Redis accepted the command and went
// silent. A write cut short reports fence.ErrOutcomeUnknown, since its
// script may still run; every error matches the context's.
//
// A client made with ContextTimeoutEnabled, which ends its reads at the
// deadline itself, is held to the same.
func TestCallsReturnByTheDeadlineWithDefaultClientOptions(t *testing.T) {
	testenv.Slow(t)
	t.Run("default", func(t *testing.T) { testCallsReturnByTheDeadline(t, false) })
	t.Run("context_timeout", func(t *testing.T) { testCallsReturnByTheDeadline(t, true) })
}

func testCallsReturnByTheDeadline(t *testing.T, contextTimeout bool) {
	const (
		timeout = 300 * time.Millisecond
		margin  = 250 * time.Millisecond // for a loaded machine
	)
	opt, err := goredis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy := testenv.StartProxy(t, opt.Addr)
	c := goredis.NewClient(&goredis.Options{Addr: proxy.Addr(), DB: opt.DB, ContextTimeoutEnabled: contextTimeout})
	t.Cleanup(func() { _ = c.Close() })
	s, err := New(c, WithPrefix(testenv.Prefix(t)))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.Preload(ctx); err != nil {
		t.Fatal(err)
	}
	f := fen(1, "h")
	if _, err := s.FencedSet(ctx, f, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	proxy.Block()
	t.Cleanup(proxy.Unblock)

	for _, tc := range []struct {
		name  string
		write bool
		call  func(ctx context.Context) error
	}{
		{"Get", true, func(ctx context.Context) error { _, err := s.FencedGet(ctx, f, "k"); return err }},
		{"Set", true, func(ctx context.Context) error { _, err := s.FencedSet(ctx, f, "k", []byte("w")); return err }},
		{"SetIfVersion", true, func(ctx context.Context) error {
			_, err := s.FencedSetIfVersion(ctx, f, "k", 1, []byte("w"))
			return err
		}},
		{"Delete", true, func(ctx context.Context) error { return s.FencedDelete(ctx, f, "k") }},
		{"Update", false, func(ctx context.Context) error {
			_, err := s.FencedUpdate(ctx, f, "k", func(Value) ([]byte, error) { return []byte("u"), nil })
			return err
		}},
		{"Load", false, func(ctx context.Context) error { _, err := s.Load(ctx, "k"); return err }},
		{"HighWater", false, func(ctx context.Context) error { _, err := s.HighWater(ctx, "k"); return err }},
		{"CompareAndSet", true, func(ctx context.Context) error { _, err := s.CompareAndSet(ctx, "k", 1, []byte("c")); return err }},
		{"CompareAndDelete", true, func(ctx context.Context) error { _, err := s.CompareAndDelete(ctx, "k", 1); return err }},
		{"Modify", false, func(ctx context.Context) error {
			_, err := s.Modify(ctx, "k", 3, func(Value) ([]byte, error) { return []byte("m"), nil })
			return err
		}},
		{"Preload", false, s.Preload},
	} {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		start := time.Now()
		err := tc.call(cctx)
		took := time.Since(start)
		cancel()
		t.Logf("%s with a %v context and Redis silent: %v (%v)", tc.name, timeout, took.Round(time.Millisecond), err)
		switch {
		case err == nil:
			t.Errorf("%s succeeded with Redis silent", tc.name)
		case !errors.Is(err, context.DeadlineExceeded):
			t.Errorf("%s = %v, want an error matching context.DeadlineExceeded", tc.name, err)
		case tc.write && !contextTimeout && !errors.Is(err, fence.ErrOutcomeUnknown):
			// (A client that ends the call itself reports whether it sent
			// the command: after the first call it cannot even finish a
			// new connection's handshake, so nothing is sent.)
			t.Errorf("%s = %v, want an error matching fence.ErrOutcomeUnknown: it may still run", tc.name, err)
		}
		if took > timeout+margin {
			t.Errorf("%s returned after %v, past its %v deadline", tc.name, took.Round(time.Millisecond), timeout)
		}
	}
}

// pastDeadline is a context whose deadline has passed while its own timer has
// not fired yet (Err is still nil), as a loaded machine leaves it for a moment
// after a client made with ContextTimeoutEnabled ended its read at the
// deadline.
type pastDeadline struct{ context.Context }

func (pastDeadline) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

// A read that a client ended at the context's deadline, with a network
// timeout, reports the deadline even before the context's timer has run: the
// caller asked for a deadline, and "i/o timeout" is how the client kept it.
func TestAReadEndedAtTheDeadlineMatchesIt(t *testing.T) {
	s := &Store{}
	for _, write := range []bool{false, true} {
		cmd := goredis.NewCmd(context.Background())
		cmd.SetErr(&net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded})
		var sent *sendCount
		if write {
			sent = new(sendCount)
		}
		_, err := s.decode(pastDeadline{context.Background()}, "update", "k", cmd, sent)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("write %v: a read ended at the deadline = %v, want an error matching context.DeadlineExceeded", write, err)
		}
	}
}
