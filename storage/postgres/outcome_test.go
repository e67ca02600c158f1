package postgres_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/storage/postgres"
)

// proxied returns a connection to pool's database and schema that goes
// through a fault proxy of its own. One connection, and no pool in front of
// it, so that the proxy's next reply is the one the test means.
func proxied(t *testing.T, ctx context.Context, pool *pgxpool.Pool) (*testenv.Proxy, *pgx.Conn) {
	t.Helper()
	cfg := pool.Config().ConnConfig.Copy()
	p := testenv.StartProxy(t, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	host, port, err := net.SplitHostPort(p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Host, cfg.Port, cfg.Fallbacks = host, uint16(n), nil
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return p, conn
}

// A fault that strikes once the server has run the request and before its
// reply reaches the client.
type fault struct {
	name string
	// callCtx returns the context of the call under fault and the function
	// that ends it.
	callCtx func(parent context.Context) (context.Context, context.CancelFunc)
	// arm arms p for the next reply. end ends the call's context; the call
	// closes returned when it has returned.
	arm func(t *testing.T, p *testenv.Proxy, end context.CancelFunc, returned <-chan struct{})
	// cause is what the error must match besides fence.ErrOutcomeUnknown.
	cause func(err error) bool
}

// expiring is a context whose deadline passes when the test says so rather
// than at a time fixed in advance, which on a loaded machine could come
// before the request is sent or long after its reply. Done and Err are all
// that pgx's connection reads of a context.
type expiring struct {
	context.Context
	done chan struct{}
	once sync.Once
}

func newExpiring(parent context.Context) (context.Context, context.CancelFunc) {
	c := &expiring{Context: parent, done: make(chan struct{})}
	return c, func() { c.once.Do(func() { close(c.done) }) }
}

func (c *expiring) Done() <-chan struct{} { return c.done }

func (c *expiring) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// endWhileHeld arms p so that, once the server has run the request and its
// reply reaches the proxy, the call's context ends and the call returns
// before the connection is cut: what the call sees is its context ending.
func endWhileHeld(t *testing.T, p *testenv.Proxy, end context.CancelFunc, returned <-chan struct{}) {
	p.LoseNextReply(func() {
		end()
		select {
		case <-returned:
		case <-time.After(20 * time.Second):
			t.Error("the call did not return after its context ended")
		}
	})
}

var faults = []fault{
	{
		name:    "context cancelled while the reply is held",
		callCtx: context.WithCancel,
		arm:     endWhileHeld,
		cause:   func(err error) bool { return errors.Is(err, context.Canceled) },
	},
	{
		name:    "deadline passes while the reply is held",
		callCtx: newExpiring,
		arm:     endWhileHeld,
		cause:   func(err error) bool { return errors.Is(err, context.DeadlineExceeded) },
	},
	{
		name:    "reply lost and connection cut",
		callCtx: context.WithCancel,
		arm: func(t *testing.T, p *testenv.Proxy, _ context.CancelFunc, _ <-chan struct{}) {
			p.LoseNextReply(nil)
		},
		cause: func(err error) bool { return !errors.Is(err, context.Canceled) && !pgconn.Timeout(err) },
	},
}

// Every call that commits its own write and loses the reply (its context
// ends, or its connection breaks, after the server ran the request) returns
// an error matching fence.ErrOutcomeUnknown and its cause, and the write did
// commit: reporting it as not applied would invite a retry that applies it
// twice.
func TestInFlightOutcomeIsUnknown(t *testing.T) {
	f := fenceOf("counter", 5, "a")
	incr := postgres.Statement{SQL: `UPDATE counter SET n = n + 1 WHERE id = 1`}
	tbl := postgres.Table{Name: pgx.Identifier{"counter"}, Key: "id", Token: "unused_token", Holder: "unused_holder", Version: "writer"}
	// Each call arms the fault (arm) just before the request whose reply
	// is to be lost: the batch, the statement, or InTx's COMMIT.
	calls := []struct {
		name string
		call func(ctx context.Context, conn *pgx.Conn, i int, arm func()) error
	}{
		{"Exec", func(ctx context.Context, conn *pgx.Conn, _ int, arm func()) error {
			arm()
			_, err := postgres.Exec(ctx, conn, f, incr)
			return err
		}},
		{"InTx", func(ctx context.Context, conn *pgx.Conn, _ int, arm func()) error {
			return postgres.InTx(ctx, conn, pgx.TxOptions{}, f, func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, incr.SQL)
				arm() // the next reply is COMMIT's
				return err
			})
		}},
		{"Query", func(ctx context.Context, conn *pgx.Conn, _ int, arm func()) error {
			arm()
			stmt := postgres.Statement{SQL: incr.SQL + ` RETURNING n`}
			return postgres.Query(ctx, conn, f, stmt, func(rows pgx.Rows) error {
				for rows.Next() {
				}
				return rows.Err()
			})
		}},
		{"Table.UpdateVersion", func(ctx context.Context, conn *pgx.Conn, i int, arm func()) error {
			arm()
			_, err := tbl.UpdateVersion(ctx, conn, 1, int64(i), postgres.Set("n", i+1))
			return err
		}},
	}
	for _, c := range calls {
		for _, flt := range faults {
			t.Run(c.name+"/"+flt.name, func(t *testing.T) {
				ctx, pool := setup(t)
				p, conn := proxied(t, ctx, pool)
				// A first call prepares the statements on the connection, so
				// that the armed reply is the request's, not a prepare's.
				if err := c.call(ctx, conn, 0, func() {}); err != nil {
					t.Fatalf("first call: %v", err)
				}
				cctx, cancel := flt.callCtx(ctx)
				defer cancel()
				returned := make(chan struct{})
				err := c.call(cctx, conn, 1, func() { flt.arm(t, p, cancel, returned) })
				close(returned)
				if !errors.Is(err, fence.ErrOutcomeUnknown) || !flt.cause(err) {
					t.Fatalf("err = %v (%T), want one matching fence.ErrOutcomeUnknown and its cause", err, err)
				}
				var unknown *fence.OutcomeUnknownError
				if !errors.As(err, &unknown) || unknown.Op == "" {
					t.Fatalf("err = %#v, want a *fence.OutcomeUnknownError naming the call", err)
				}
				if n, _ := counter(t, ctx, pool); n != 2 {
					t.Fatalf("n = %d after the call in flight, want 2: the server applied it", n)
				}
			})
		}
	}
}

// Table.Update and Table.Upsert commit by themselves too.
func TestInFlightOutcomeIsUnknownForRowFences(t *testing.T) {
	tbl := postgres.Table{Name: pgx.Identifier{"rows"}, Key: "id"}
	for _, flt := range faults {
		t.Run(flt.name, func(t *testing.T) {
			ctx, pool := setup(t)
			mustExec(t, ctx, pool, `CREATE TABLE rows (id int PRIMARY KEY, v bigint, fence_token bigint, fence_holder text, version bigint)`)
			p, conn := proxied(t, ctx, pool)
			for i, call := range []func(ctx context.Context, i int64) error{
				func(ctx context.Context, i int64) error {
					return tbl.Upsert(ctx, conn, fenceOf("r", i, "a"), 1, postgres.Set("v", i))
				},
				func(ctx context.Context, i int64) error {
					return tbl.Update(ctx, conn, fenceOf("r", i, "a"), 1, postgres.Set("v", i))
				},
			} {
				base := int64(10 * (i + 1))
				if err := call(ctx, base); err != nil {
					t.Fatal(err)
				}
				cctx, cancel := flt.callCtx(ctx)
				returned := make(chan struct{})
				flt.arm(t, p, cancel, returned)
				err := call(cctx, base+1)
				close(returned)
				cancel()
				if !errors.Is(err, fence.ErrOutcomeUnknown) || !flt.cause(err) {
					t.Fatalf("call %d: err = %v, want one matching fence.ErrOutcomeUnknown and its cause", i, err)
				}
				var v int64
				if err := pool.QueryRow(ctx, `SELECT v FROM rows WHERE id = 1`).Scan(&v); err != nil {
					t.Fatal(err)
				}
				if v != base+1 {
					t.Fatalf("call %d: v = %d, want %d: the server applied it", i, v, base+1)
				}
				// The connection is gone; the next call needs another.
				p, conn = proxied(t, ctx, pool)
			}
		})
	}
}

// A call that surely applied nothing keeps saying so: no ErrOutcomeUnknown
// for a context done before anything was sent, a context that ends before
// COMMIT is sent, an error reply (a failing statement, a stale guard, a
// deferred constraint that fails at COMMIT).
func TestSurelyNotAppliedIsNotUnknown(t *testing.T) {
	ctx, pool := setup(t)
	f := fenceOf("counter", 5, "a")
	mustExec(t, ctx, pool, `CREATE TABLE uniq (v int UNIQUE DEFERRABLE INITIALLY DEFERRED)`)
	done, cancel := context.WithCancel(ctx)
	cancel()
	cases := map[string]func() error{
		"Exec with a done context": func() error {
			_, err := postgres.Exec(done, pool, f, postgres.Statement{SQL: `UPDATE counter SET n = n + 1`})
			return err
		},
		"Exec whose statement fails": func() error {
			_, err := postgres.Exec(ctx, pool, f, postgres.Statement{SQL: `UPDATE counter SET n = n + 1`}, postgres.Statement{SQL: `SELECT 1/0`})
			return err
		},
		"Exec stale": func() error {
			_, err := postgres.Exec(ctx, pool, fenceOf("counter", 1, "old"), postgres.Statement{SQL: `UPDATE counter SET n = n + 1`})
			return err
		},
		"InTx cancelled before COMMIT": func() error {
			cctx, cancel := context.WithCancel(ctx)
			return postgres.InTx(cctx, pool, pgx.TxOptions{}, f, func(ctx context.Context, tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `UPDATE counter SET n = n + 1`); err != nil {
					return err
				}
				cancel() // COMMIT is never sent
				return nil
			})
		},
		"InTx whose COMMIT fails": func() error {
			return postgres.InTx(ctx, pool, pgx.TxOptions{}, f, func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `UPDATE counter SET n = n + 1; INSERT INTO uniq VALUES (1), (1)`)
				return err
			})
		},
		"Table.Update with a done context": func() error {
			return postgres.Table{Name: pgx.Identifier{"counter"}, Key: "id", Token: "n", Holder: "writer"}.Update(done, pool, f, 1)
		},
	}
	// The stale case needs a mark above its fence.
	raise(t, ctx, pool, f)
	for name, call := range cases {
		err := call()
		if err == nil || errors.Is(err, fence.ErrOutcomeUnknown) {
			t.Errorf("%s: err = %v, want an error that is not ErrOutcomeUnknown", name, err)
		}
	}
	if n, _ := counter(t, ctx, pool); n != 0 {
		t.Fatalf("n = %d, want 0: none of the calls applied", n)
	}
}

// Retry never reruns work whose outcome is unknown, even when the cause
// would be retryable on its own.
func TestRetryStopsAtUnknownOutcome(t *testing.T) {
	calls := 0
	unknown := &fence.OutcomeUnknownError{Op: "test", Err: &postgres.RetryableError{Err: errors.New("40001")}}
	err := postgres.Retry(context.Background(), 5, func(context.Context) error {
		calls++
		return unknown
	})
	if calls != 1 || !errors.Is(err, fence.ErrOutcomeUnknown) {
		t.Fatalf("Retry called fn %d times and returned %v; want once, returning the unknown outcome", calls, err)
	}
}

// The first batch on a connection prepares its statements in a round trip
// of its own before sending them: a context that ends during that round
// trip leaves nothing applied, and Exec says so.
func TestExecCutOffWhilePreparingIsNotUnknown(t *testing.T) {
	ctx, pool := setup(t)
	p, conn := proxied(t, ctx, pool)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	returned := make(chan struct{})
	endWhileHeld(t, p, cancel, returned) // the reply to the prepare round trip
	_, err := postgres.Exec(cctx, conn, fenceOf("counter", 1, "a"), postgres.Statement{SQL: `UPDATE counter SET n = n + 1 WHERE id = 1`})
	close(returned)
	if !errors.Is(err, context.Canceled) || errors.Is(err, fence.ErrOutcomeUnknown) {
		t.Fatalf("err = %v, want context.Canceled and not an unknown outcome", err)
	}
	if n, _ := counter(t, ctx, pool); n != 0 {
		t.Fatalf("n = %d, want 0", n)
	}
	if got := mark(t, ctx, pool, "counter"); got.Token != 0 {
		t.Fatalf("mark = %v, want none", got)
	}
}

// Calls made on the caller's pgx.Tx commit nothing themselves: a reply cut
// off there is not an unknown outcome of theirs, and nothing commits
// without the caller's COMMIT, which the cut connection can no longer send.
func TestInCallersTransactionNeverUnknown(t *testing.T) {
	f := fenceOf("counter", 5, "a")
	incr := `UPDATE counter SET n = n + 1 WHERE id = 1`
	calls := map[string]func(ctx context.Context, tx pgx.Tx, arm func()) error{
		"InTx in a savepoint": func(ctx context.Context, tx pgx.Tx, arm func()) error {
			return postgres.InTx(ctx, tx, pgx.TxOptions{}, f, func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, incr)
				arm() // the next reply is RELEASE SAVEPOINT's
				return err
			})
		},
		"Exec": func(ctx context.Context, tx pgx.Tx, arm func()) error {
			arm()
			_, err := postgres.Exec(ctx, tx, f, postgres.Statement{SQL: incr})
			return err
		},
		"Once in a savepoint": func(ctx context.Context, tx pgx.Tx, arm func()) error {
			_, err := postgres.Once(ctx, tx, f, "k", func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, incr)
				arm()
				return err
			})
			return err
		},
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			ctx, pool := setup(t)
			p, conn := proxied(t, ctx, pool)
			// Prepare the statements on the connection first.
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := call(ctx, tx, func() {}); err != nil {
				t.Fatalf("first call: %v", err)
			}
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			tx, err = conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			err = call(ctx, tx, func() { p.LoseNextReply(nil) })
			if err == nil || errors.Is(err, fence.ErrOutcomeUnknown) {
				t.Fatalf("err = %v, want an error that is not an unknown outcome", err)
			}
			_ = tx.Rollback(ctx)
			if n, _ := counter(t, ctx, pool); n != 0 {
				t.Fatalf("n = %d, want 0: nothing commits without the caller's COMMIT", n)
			}
		})
	}
}
