package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/storage/postgres"
)

type stepKind int

const (
	stepGuard stepKind = iota
	stepWrite
	stepCommit
)

func (k stepKind) String() string { return [...]string{"guard", "write", "commit"}[k] }

type step struct {
	tx   int // 0: lower token, 1: higher token
	kind stepKind
}

// interleavings returns every order of two three-step sequences that keeps
// each sequence's own order: C(6,3) = 20 schedules.
func interleavings() [][]step {
	var out [][]step
	var rec func(prefix []step, next [2]int)
	rec = func(prefix []step, next [2]int) {
		if next[0] == 3 && next[1] == 3 {
			out = append(out, append([]step(nil), prefix...))
			return
		}
		for tx := range 2 {
			if next[tx] < 3 {
				n := next
				n[tx]++
				rec(append(prefix, step{tx, stepKind(next[tx])}), n)
			}
		}
	}
	rec(nil, [2]int{})
	return out
}

// txRunner drives one fenced transaction (InTx) step by step from a test.
type txRunner struct {
	f       fence.Fence
	cmds    chan stepKind
	results chan error
	pid     uint32
	busy    bool // a step was sent and has not answered
	done    bool // the transaction ended (committed or failed)
	err     error
}

func startRunner(ctx context.Context, conn *pgxpool.Conn, iso pgx.TxIsoLevel, f fence.Fence) *txRunner {
	r := &txRunner{f: f, cmds: make(chan stepKind), results: make(chan error, 1), pid: conn.Conn().PgConn().PID()}
	go func() {
		if _, ok := <-r.cmds; !ok { // stepGuard
			return
		}
		err := postgres.InTx(ctx, conn, pgx.TxOptions{IsoLevel: iso}, f, func(ctx context.Context, tx pgx.Tx) error {
			r.results <- nil // the guard admitted f
			<-r.cmds         // stepWrite
			if _, err := tx.Exec(ctx, `UPDATE counter SET n = n + 1, writer = $1 WHERE id = 1`, int64(f.Token)); err != nil {
				return err
			}
			r.results <- nil
			<-r.cmds // stepCommit
			return nil
		})
		r.results <- err // the result of the guard, the write or the commit
	}()
	return r
}

// play runs one schedule with the lower token (tx 0) and the higher (tx 1).
// A step whose backend waits on a lock is left pending, and the schedule
// goes on with the other transaction's steps, as it would in production.
func play(t *testing.T, ctx context.Context, pool *pgxpool.Pool, conns [2]*pgxpool.Conn, iso pgx.TxIsoLevel, sched []step) [2]*txRunner {
	t.Helper()
	rs := [2]*txRunner{
		startRunner(ctx, conns[0], iso, fenceOf("r", 1, "low")),
		startRunner(ctx, conns[1], iso, fenceOf("r", 2, "high")),
	}
	finish := func(r *txRunner, err error, k stepKind) {
		r.busy = false
		if err != nil || k == stepCommit {
			r.done, r.err = true, err
		}
	}
	kinds := [2]stepKind{}
	queue := append([]step(nil), sched...)
	deadline := time.Now().Add(20 * time.Second)
	for {
		// Collect answers of pending steps.
		for i, r := range rs {
			if r.busy {
				select {
				case err := <-r.results:
					finish(rs[i], err, kinds[i])
				default:
				}
			}
		}
		// Drop steps of ended transactions; find the next step to send.
		next := -1
		for i := 0; i < len(queue); {
			if rs[queue[i].tx].done {
				queue = append(queue[:i], queue[i+1:]...)
				continue
			}
			if next < 0 && !rs[queue[i].tx].busy {
				next = i
			}
			i++
		}
		if len(queue) == 0 && !rs[0].busy && !rs[1].busy {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("schedule %v stuck", sched)
		}
		if next < 0 {
			time.Sleep(time.Millisecond) // poll interval while both are pending
			continue
		}
		s := queue[next]
		queue = append(queue[:next], queue[next+1:]...)
		r := rs[s.tx]
		kinds[s.tx] = s.kind
		r.cmds <- s.kind
		r.busy = true
		// Wait until the step answers or its backend waits on a lock.
		for r.busy {
			select {
			case err := <-r.results:
				finish(r, err, s.kind)
				continue
			default:
			}
			var waiting bool
			if err := pool.QueryRow(ctx, `SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1`, int32(r.pid)).Scan(&waiting); err != nil {
				t.Fatal(err)
			}
			if waiting {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("schedule %v: step %v stuck", sched, s)
			}
			time.Sleep(200 * time.Microsecond) // poll interval
		}
	}
	for _, r := range rs {
		close(r.cmds)
	}
	return rs
}

func scheduleString(sched []step) string {
	var b strings.Builder
	for i, s := range sched {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s%d", s.kind, s.tx+1)
	}
	return b.String()
}

// Two fenced transactions with tokens 1 and 2, in every order of their
// guard, write and commit, at each isolation level: the higher token's write
// survives, every failure is stale or retryable, and retrying a retryable
// failure ends with the same outcome.
func TestTwoTransactionsEveryOrder(t *testing.T) {
	for _, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable} {
		t.Run(string(iso), func(t *testing.T) {
			ctx, pool := setup(t)
			conns := [2]*pgxpool.Conn{acquire(t, ctx, pool), acquire(t, ctx, pool)}
			retryables := 0
			for _, sched := range interleavings() {
				name := scheduleString(sched)
				mustExec(t, ctx, pool, `DELETE FROM fencekit_guard`)
				mustExec(t, ctx, pool, `UPDATE counter SET n = 0, writer = 0 WHERE id = 1`)
				rs := play(t, ctx, pool, conns, iso, sched)
				committed := 0
				for _, r := range rs {
					switch {
					case r.err == nil:
						committed++
						continue
					case errors.Is(r.err, fence.ErrStale):
						if r.f.Token == 2 {
							t.Fatalf("%s: the higher token was stale: %v", name, r.err)
						}
						continue
					case errors.Is(r.err, postgres.ErrRetryable):
						retryables++
						if iso == pgx.ReadCommitted {
							t.Fatalf("%s: retryable error at READ COMMITTED: %v", name, r.err)
						}
					default:
						t.Fatalf("%s: token %d: unexpected error %v", name, r.f.Token, r.err)
					}
					// Run the retryable transaction again, as a caller would.
					err := postgres.Retry(ctx, 0, func(ctx context.Context) error {
						return postgres.InTx(ctx, pool, pgx.TxOptions{IsoLevel: iso}, r.f, func(ctx context.Context, tx pgx.Tx) error {
							_, err := tx.Exec(ctx, `UPDATE counter SET n = n + 1, writer = $1 WHERE id = 1`, int64(r.f.Token))
							return err
						})
					})
					switch {
					case err == nil:
						if r.f.Token == 1 {
							t.Fatalf("%s: the lower token's retry was admitted after the higher one ran", name)
						}
						committed++
					case r.f.Token == 1 && errors.Is(err, fence.ErrStale):
					default:
						t.Fatalf("%s: retry of token %d: %v", name, r.f.Token, err)
					}
				}
				n, writer := counter(t, ctx, pool)
				if writer != 2 {
					t.Fatalf("%s: last writer is token %d, want 2", name, writer)
				}
				if n != int64(committed) {
					t.Fatalf("%s: %d transactions committed, counter is %d", name, committed, n)
				}
				if got := mark(t, ctx, pool, "r"); got != fenceOf("r", 2, "high") {
					t.Fatalf("%s: mark = %v", name, got)
				}
			}
			if iso != pgx.ReadCommitted && retryables == 0 {
				t.Fatalf("no schedule at %s produced a retryable error; the test cannot see them", iso)
			}
			t.Logf("%d retryable failures over %d schedules", retryables, len(interleavings()))
		})
	}
}
