package pglock

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/internal/harness/testenv"
)

// TestSilentListenerReplaced: the LISTEN connection stops answering
// without FIN or RST (the network drops its flow both ways). Within the
// bound the package states (listenPing + listenPingTimeout, plus a
// connect) the listener is replaced by a new LISTEN session, and the
// silent session is ended on the server, so it no longer pins the
// database's NOTIFY queue; notifications reach the subscriptions again.
func TestSilentListenerReplaced(t *testing.T) {
	base := migratedPool(t)
	proxy := testenv.StartProxy(t, hostPort(t, base))
	via := poolAt(t, base, "postgres://postgres@"+proxy.Addr()+"/test?sslmode=disable", nil)
	b := testBackend(t, base, config{listenVia: via})
	ctx := ctxFor(t, 60*time.Second)
	old := b.listen.pid()
	if old == 0 {
		t.Fatal("the listener knows no backend pid")
	}
	proxy.SilenceOpen()
	start := time.Now()
	bound := listenPing + listenPingTimeout + 10*time.Second // generous: a loaded machine
	eventually(t, bound, "a new LISTEN session", func() bool {
		p := b.listen.pid()
		return p != 0 && p != old && b.listen.up()
	})
	replaced := time.Since(start)
	eventually(t, 10*time.Second, "the silent session ended on the server", func() bool {
		var n int
		err := base.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, int32(old)).Scan(&n)
		return err == nil && n == 0
	})
	ended := time.Since(start)
	// Notifications flow again.
	s := b.listen.subscribe("r:probe")
	defer b.listen.unsubscribe(s)
	for {
		if _, err := base.Exec(ctx, `SELECT pg_notify($1, 'probe 1 x')`, recordChannel); err != nil {
			t.Fatal(err)
		}
		select {
		case p := <-s.c:
			if p == "" {
				continue // a reconnect said notifications may have been missed
			}
			t.Logf("silent listener replaced after %v, its session ended after %v", replaced.Round(time.Millisecond), ended.Round(time.Millisecond))
			return
		case <-time.After(5 * time.Second):
			t.Fatal("no notification reached the replaced listener")
		}
	}
}

// TestListenerConnectsAsThePool: the pool's BeforeConnect supplies the
// address (its ConnConfig names a port where nothing listens, as with
// service discovery) and its AfterConnect runs on each connection; the
// listener connects through both, as the pool's connections do. A
// listener that cannot connect (a BeforeConnect that fails) is reported:
// a warning on slog's default logger, and the failures counter.
func TestListenerConnectsAsThePool(t *testing.T) {
	base := migratedPool(t)
	cfg := base.Config()
	real := cfg.ConnConfig.Copy()
	cfg.ConnConfig.Port = 1 // nothing listens there
	var after atomic.Int32
	cfg.BeforeConnect = func(_ context.Context, c *pgx.ConnConfig) error {
		c.Host, c.Port = real.Host, real.Port
		return nil
	}
	cfg.AfterConnect = func(context.Context, *pgx.Conn) error {
		after.Add(1)
		return nil
	}
	ctx := ctxFor(t, 60*time.Second)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	b := testBackend(t, pool, config{}) // fails unless the listener is up within 10s
	if after.Load() < 1 {
		t.Fatalf("AfterConnect ran %d times, want at least the listener's", after.Load())
	}
	if _, err := b.tryAcquire(ctx, "r", "h", time.Second); err != nil {
		t.Fatal(err)
	}

	// A BeforeConnect that fails: reported.
	var logged bytes.Buffer
	var mu sync.Mutex
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&lockedWriter{mu: &mu, w: &logged}, nil)))
	defer slog.SetDefault(prev)
	bad := base.Config()
	bad.BeforeConnect = func(context.Context, *pgx.ConnConfig) error { return errors.New("no address from discovery") }
	badPool, err := pgxpool.NewWithConfig(ctx, bad)
	if err != nil {
		t.Fatal(err)
	}
	defer badPool.Close()
	nb := newBackend(badPool, config{retention: time.Minute})
	defer nb.close()
	eventually(t, 10*time.Second, "the listener's failure logged", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return strings.Contains(logged.String(), "LISTEN connection cannot connect") && strings.Contains(logged.String(), "no address from discovery")
	})
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
