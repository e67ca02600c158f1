package pgsqlsuite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/storage/pgsql"
)

func init() {
	register(test{"RoundTrips", testRoundTrips})
}

// turnCounter is a TCP proxy that counts round trips: the times a client
// sends after the server last spoke (or first). A client that pipelines
// sends once per round trip, however many messages it packs.
type turnCounter struct {
	ln    net.Listener
	turns atomic.Int64
}

func startTurnCounter(t *testing.T, target string) *turnCounter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &turnCounter{ln: ln}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				client.Close()
				continue
			}
			var serverSpoke atomic.Bool
			serverSpoke.Store(true)
			wg.Go(func() {
				defer server.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := client.Read(buf)
					if n > 0 {
						if serverSpoke.Swap(false) {
							c.turns.Add(1)
						}
						if _, werr := server.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			})
			wg.Go(func() {
				defer client.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := server.Read(buf)
					if n > 0 {
						serverSpoke.Store(true)
						if _, werr := client.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						if err != io.EOF {
							return
						}
						return
					}
				}
			})
		}
	})
	return c
}

// count returns the fewest round trips of three runs of fn, each after a
// run that warms the connection (and the driver's statement cache).
func (c *turnCounter) count(t *testing.T, fn func() error) int64 {
	t.Helper()
	best := int64(-1)
	for range 3 {
		if err := fn(); err != nil {
			t.Fatal(err)
		}
		before := c.turns.Load()
		if err := fn(); err != nil {
			t.Fatal(err)
		}
		if n := c.turns.Load() - before; best < 0 || n < best {
			best = n
		}
	}
	return best
}

// testRoundTrips counts what the guard costs on the wire: InTx is the plain
// transaction (BEGIN, UPDATE, COMMIT) plus one round trip, and
// Table.Update is as many round trips as the plain autocommit UPDATE with
// arguments it replaces. The log gives each driver's figures.
func testRoundTrips(t *testing.T, d Driver) {
	e, tbl := accounts(t, d)
	tc := startTurnCounter(t, hostOf(t, e.url))
	db := open(t, d, e.via(tc.ln.Addr().String()))
	db.SetMaxOpenConns(1)
	ctx := e.ctx
	f := fenceOf("rt", 1, "h")
	const update = `UPDATE counter SET n = n + 1 WHERE id = 1`
	var n int64
	oneStatement := tc.count(t, func() error {
		n++
		_, err := db.ExecContext(ctx, `UPDATE accounts SET balance = $2 WHERE id = $1`, "a", n)
		return err
	})
	plainTx := tc.count(t, func() error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, update); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	})
	inTx := tc.count(t, func() error {
		return pgsql.InTx(ctx, db, nil, f, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, update)
			return err
		})
	})
	tableUpdate := tc.count(t, func() error {
		n++
		return tbl.Update(ctx, db, f, "a", pgsql.Set("balance", n))
	})
	guardTx := tc.count(t, func() error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if err := pgsql.Guard(ctx, tx, f); err != nil {
			_ = tx.Rollback()
			return err
		}
		if _, err := tx.ExecContext(ctx, update); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	})
	staleInTx := tc.count(t, func() error {
		err := pgsql.InTx(ctx, db, nil, fenceOf("rt", 1, "other"), func(context.Context, *sql.Tx) error {
			return errors.New("fn ran under a stale fence")
		})
		if mark, ok := fence.LostTo(err); !ok || mark != f {
			return fmt.Errorf("stale InTx = %v, want a refusal that lost to %v", err, f)
		}
		return nil
	})
	staleGuardTx := tc.count(t, func() error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		err = pgsql.Guard(ctx, tx, fenceOf("rt", 1, "other"))
		if mark, ok := fence.LostTo(err); !ok || mark != f {
			return fmt.Errorf("stale Guard = %v, want a refusal that lost to %v", err, f)
		}
		return nil
	})
	t.Logf("%s round trips: plain transaction %d, InTx %d, stale InTx %d, Guard in the caller's transaction %d, stale Guard with BEGIN and ROLLBACK %d; autocommit UPDATE with arguments %d, Table.Update %d",
		d.Name, plainTx, inTx, staleInTx, guardTx, staleGuardTx, oneStatement, tableUpdate)
	// BEGIN, the guard, ROLLBACK: Guard's refusal carries its mark too.
	if staleGuardTx != 2+oneStatement {
		t.Errorf("BEGIN, a stale Guard and ROLLBACK took %d round trips, want 2 and the guard's %d", staleGuardTx, oneStatement)
	}
	// BEGIN, the guard, ROLLBACK: the refusal carries its mark. A driver
	// that prepares statements prepares the refused guard again.
	if staleInTx != 2+oneStatement+d.Reprepare {
		t.Errorf("a stale InTx took %d round trips, want BEGIN, the guard's %d, ROLLBACK and %d to prepare the guard again", staleInTx, oneStatement, d.Reprepare)
	}
	// Guard, its savepoint check included, is one statement with arguments
	// (two round trips on lib/pq by default).
	if guardTx != plainTx+oneStatement {
		t.Errorf("a transaction with Guard took %d round trips, want the plain transaction's %d plus the guard's %d", guardTx, plainTx, oneStatement)
	}
	// InTx's guard is one statement with arguments, sent as the driver
	// sends any (two round trips on lib/pq without binary_parameters).
	if inTx != plainTx+oneStatement {
		t.Errorf("InTx took %d round trips, want the plain transaction's %d plus one statement's %d", inTx, plainTx, oneStatement)
	}
	if tableUpdate != oneStatement {
		t.Errorf("Table.Update took %d round trips, want a plain UPDATE's %d", tableUpdate, oneStatement)
	}
}
