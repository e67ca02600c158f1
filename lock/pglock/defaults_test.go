package pglock

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
	"github.com/fencekit/fencekit/migrations"
)

// databaseWith is a pool on a database of t's own, migrated, whose
// defaults are set (ALTER DATABASE ... SET name = value) before the pool
// connects: what a database or a role may impose on every session.
func databaseWith(t testing.TB, settings map[string]string) *pgxpool.Pool {
	t.Helper()
	dbURL, drop := testenv.PostgresDatabase(t, testenv.PostgresBaseURL(t), "fk_pglock_defaults_")
	t.Cleanup(drop)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	name := strings.TrimPrefix(u.Path, "/")
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	// Migrate first: the migrations are the operator's, run once.
	mig, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	if err := migrations.UpPool(ctx, mig); err != nil {
		t.Fatal(err)
	}
	mig.Close()
	for k, v := range settings {
		if _, err := conn.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{name}.Sanitize()+" SET "+k+" = '"+v+"'"); err != nil {
			t.Fatal(err)
		}
	}
	_ = conn.Close(ctx)
	pool, err := pgxpool.New(ctx, dbURL+"&pool_max_conns=8")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	for k, v := range settings {
		var got string
		if err := pool.QueryRow(ctx, "SELECT current_setting('"+k+"')").Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != v && !(strings.HasSuffix(v, "ms") && got == v) {
			t.Logf("%s is %q on the pool's sessions (set %q)", k, got, v)
		}
	}
	return pool
}

// TestDatabaseDefaults: with default_transaction_isolation at REPEATABLE
// READ or SERIALIZABLE on the database, 8 clients x 15 rounds of Acquire,
// TryAcquire and Release on one resource get no error (a serialization
// failure of the lock's own statement is the lock's to retry); with
// statement_timeout or lock_timeout of 5ms, a call may fail, with an
// error that names the timeout, and no lock is left behind: once the
// clients are done the lock is free at once.
func TestDatabaseDefaults(t *testing.T) {
	for _, tc := range []struct {
		name     string
		settings map[string]string
		errorsOK bool
	}{
		{"repeatable read", map[string]string{"default_transaction_isolation": "repeatable read"}, false},
		{"serializable", map[string]string{"default_transaction_isolation": "serializable"}, false},
		{"statement_timeout", map[string]string{"statement_timeout": "5ms"}, true},
		{"lock_timeout", map[string]string{"lock_timeout": "5ms"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := databaseWith(t, tc.settings)
			ctx := ctxFor(t, 120*time.Second)
			var (
				mu      sync.Mutex
				errs    []error
				calls   int
				wg      sync.WaitGroup
				lockers []*lock.Locker
			)
			for i := range 8 {
				l, err := New(pool)
				if err != nil {
					t.Fatal(err)
				}
				defer l.Close()
				lockers = append(lockers, l)
				wg.Add(1)
				go func() {
					defer wg.Done()
					for round := range 15 {
						var (
							ls  *lock.Lease
							err error
						)
						callCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
						if (i+round)%2 == 0 {
							ls, err = l.Acquire(callCtx, "r", 5*time.Second)
						} else {
							ls, err = l.TryAcquire(callCtx, "r", 5*time.Second)
							var na *lock.NotAcquiredError
							if errors.As(err, &na) {
								err = nil
							}
						}
						if err == nil && ls != nil {
							err = ls.Release(callCtx)
						}
						cancel()
						mu.Lock()
						calls++
						if err != nil {
							errs = append(errs, err)
						}
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			t.Logf("%d rounds, %d errors", calls, len(errs))
			for _, err := range errs {
				if !tc.errorsOK {
					t.Errorf("error under %v: %v", tc.settings, err)
					continue
				}
				if msg := err.Error(); !strings.Contains(msg, "statement_timeout") && !strings.Contains(msg, "lock_timeout") {
					t.Errorf("error under %v does not name the timeout: %v", tc.settings, err)
				}
			}
			// Nothing left behind: the lock is free now.
			var holder *string
			err := pool.QueryRow(ctx, `SELECT holder FROM fencekit_lock WHERE resource = 'r' AND expires_at > clock_timestamp()`).Scan(&holder)
			if err == nil && holder != nil {
				t.Fatalf("the lock stands granted after every client released (or gave up)")
			}
			// And it can be had.
			tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			for {
				ls, err := lockers[0].TryAcquire(tctx, "r", time.Second)
				if err == nil {
					_ = ls.Release(tctx)
					break
				}
				if tctx.Err() != nil {
					t.Fatalf("the lock cannot be had after the clients: %v", err)
				}
			}
		})
	}
}
