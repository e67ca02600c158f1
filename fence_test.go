package fencekit_test

// End-to-end proofs after Jepsen's lock-set workload (DESIGN.md section 6):
// workers acquire a short lease, read a counter, pause (some past the lease),
// write the counter plus one and release, against real Redis, PostgreSQL and
// MySQL (or MariaDB), under faults. With fenced reads and writes no acknowledged increment is
// lost and admitted tokens never go down; the negative controls (the lock
// alone, or fenced writes with plain reads) must lose increments, or the
// suite cannot see what it claims to prevent.
//
// FENCEKIT_SOAK=<duration> (for example 2m) runs every scenario that long.

import (
	"context"
	"database/sql"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/internal/harness/workload"
	"github.com/fencekit/fencekit/lock"
	"github.com/fencekit/fencekit/migrations"
	fkredis "github.com/fencekit/fencekit/storage/redis"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
)

const ttl = 20 * time.Millisecond

var resources = []string{"acct-1", "acct-2", "acct-3"}

func runFor(t *testing.T) time.Duration {
	if s := os.Getenv("FENCEKIT_SOAK"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("FENCEKIT_SOAK=%q: %v", s, err)
		}
		return d
	}
	return 1200 * time.Millisecond
}

// recoveryRun is the length of a run that must show progress after a fault
// in its first 600ms: long enough that a loaded machine recovers within it.
func recoveryRun(t *testing.T) time.Duration {
	return max(runFor(t), 3*time.Second)
}

// progressWithin is how long after a fault a run waits for a write to be
// admitted (workload.Config.ProgressWithin) before it fails as showing no
// progress: a bound on recovery (a server restarted, a quorum regained, a
// counter's clock anchor), far above what a loaded machine takes, and not
// a share of the run's Duration. A run that recovers sooner ends sooner.
const progressWithin = 30 * time.Second

// storage builds a fresh counter store for one run.
type storage struct {
	name   string
	make   func(t *testing.T) workload.Counter
	levels []string // isolation levels its fenced transactions must each be judged at
}

func redisStorage() storage {
	return storage{name: "redis", make: func(t *testing.T) workload.Counter {
		c := testenv.Redis(t)
		p := testenv.Prefix(t)
		st, err := fkredis.New(c, fkredis.WithPrefix(p+"data:"))
		if err != nil {
			t.Fatal(err)
		}
		return &workload.RedisCounter{Client: c, Store: st, PlainPrefix: p + "plain:"}
	}}
}

func postgresStorage() storage {
	return storage{name: "postgres", make: func(t *testing.T) workload.Counter {
		return &workload.PostgresCounter{Pool: migratedPool(t, "")}
	}}
}

// isoLevels are the three isolation levels PostgreSQL and MySQL run
// (READ UNCOMMITTED runs as READ COMMITTED on PostgreSQL).
var isoLevels = []string{"read committed", "repeatable read", "serializable"}

// postgresLevelsStorage is postgresStorage on a database of the test's own
// whose default_transaction_isolation is def (the fenced writes, one
// pipelined batch each, run at it), with each fenced read at one of levels
// drawn per read (none: at def). A guard that admits a newer holder with a
// snapshot older than the older holder's last commit loses updates here;
// serialization failures are refusals (workload.Refuser), never lost or
// uncertain writes.
func postgresLevelsStorage(name, def string, levels ...pgx.TxIsoLevel) storage {
	want := []string{def}
	if len(levels) > 0 {
		want = isoLevels
	}
	return storage{name: name, levels: want, make: func(t *testing.T) workload.Counter {
		ctx := context.Background()
		u := postgresLevelsDatabase(t, def)
		pool, err := pgxpool.New(ctx, u)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close) // registered after drop, so it runs first
		t.Logf("database default %s, fenced reads at %v", def, levels)
		return &workload.PostgresCounter{Pool: pool, Levels: levels, Default: def}
	}}
}

// pgsqlLevelsStorage is postgresLevelsStorage through database/sql
// (storage/pgsql, whose guard is the judge statement): each fenced
// transaction, read or write, at one of levels, drawn per transaction
// (sql.LevelDefault: the database's; none: def only).
func pgsqlLevelsStorage(name, def string, levels ...sql.IsolationLevel) storage {
	want := []string{def}
	if len(levels) > 0 {
		want = isoLevels
	}
	return storage{name: name, levels: want, make: func(t *testing.T) workload.Counter {
		db, err := sql.Open("pgx", postgresLevelsDatabase(t, def))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() }) // registered after drop, so it runs first
		t.Logf("database default %s, fenced transactions at %v", def, levels)
		return &workload.PgsqlCounter{DB: db, Levels: levels, Default: def, HoldInTx: ttl}
	}}
}

// postgresLevelsDatabase makes a database of the test's own whose default
// isolation level is def, with the migrations applied, and returns its URL.
func postgresLevelsDatabase(t *testing.T, def string) string {
	t.Helper()
	ctx := context.Background()
	u, drop := testenv.PostgresDatabase(t, testenv.PostgresBaseURL(t), "fk_iso_")
	t.Cleanup(drop)
	admin, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	var db string
	if err := admin.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `ALTER DATABASE `+pgx.Identifier{db}.Sanitize()+` SET default_transaction_isolation = '`+def+`'`); err != nil {
		t.Fatal(err)
	}
	sdb, err := sql.Open("pgx", u)
	if err != nil {
		t.Fatal(err)
	}
	defer sdb.Close()
	if err := migrations.Up(ctx, sdb); err != nil {
		t.Fatal(err)
	}
	return u
}

// mysqlLevelsStorage is mysqlStorage with its sessions defaulting to def
// (a session setting on the test's own connections) and each fenced
// transaction at one of levels, drawn per transaction (sql.LevelDefault:
// the session's; none: def only).
func mysqlLevelsStorage(name, def string, levels ...sql.IsolationLevel) storage {
	want := []string{def}
	if len(levels) > 0 {
		want = isoLevels
	}
	return storage{name: name, levels: want, make: func(t *testing.T) workload.Counter {
		cfg := testenv.MySQLConfig(t)
		if cfg.Params == nil {
			cfg.Params = map[string]string{}
		}
		cfg.Params["tx_isolation"] = "'" + strings.ToUpper(strings.ReplaceAll(def, " ", "-")) + "'"
		db := testenv.OpenMySQL(t, cfg)
		if err := migrations.UpMySQL(context.Background(), db); err != nil {
			t.Fatal(err)
		}
		t.Logf("session default %s, fenced transactions at %v", def, levels)
		return &workload.MySQLCounter{DB: db, Levels: levels, Default: def}
	}}
}

// drawLevel is one of isoLevels, drawn.
func drawLevel() string { return isoLevels[rand.IntN(len(isoLevels))] }

// requireLevels fails a run that judged no fenced transaction at one of
// the isolation levels its storage runs (the counts are in the run's log).
func requireLevels(t *testing.T, st storage, res workload.Result) {
	t.Helper()
	for _, l := range st.levels {
		if c := res.Levels[l]; c.Judged() == 0 {
			t.Errorf("isolation level %s: no fenced transaction ended admitted or refused (%+v, all: %v)", l, c, res.Levels)
		}
	}
}

func mysqlStorage() storage {
	return storage{name: "mysql", make: func(t *testing.T) workload.Counter {
		db := testenv.MySQL(t)
		if err := migrations.UpMySQL(context.Background(), db); err != nil {
			t.Fatal(err)
		}
		return &workload.MySQLCounter{DB: db}
	}}
}

// migratedPool returns a pool on a fresh schema with the migrations applied;
// its connections carry appName when it is not empty.
func migratedPool(t *testing.T, appName string) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	url := testenv.PostgresURL(t)
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := migrations.Up(ctx, db); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	if appName != "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = appName
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func sharedLocker(t *testing.T) *lock.Locker {
	l, err := lock.New(testenv.Redis(t), lock.WithPrefix(testenv.Prefix(t)))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func run(t *testing.T, cfg workload.Config) workload.Result {
	t.Helper()
	if cfg.Duration == 0 {
		cfg.Duration = runFor(t)
	}
	if cfg.TTL == 0 {
		cfg.TTL = ttl
	}
	if cfg.Resources == nil {
		cfg.Resources = resources
	}
	res, err := workload.Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(res)
	return res
}

func requireSafe(t *testing.T, res workload.Result) {
	t.Helper()
	if !res.Safe() {
		t.Fatalf("fenced run lost updates: %v", res)
	}
	if res.Acked == 0 {
		t.Fatalf("no write was acknowledged: the run proves nothing: %v", res)
	}
	if res.Stale == 0 {
		t.Fatalf("no fence was refused: the run never exercised a stale holder: %v", res)
	}
}

// TestFencedNoLostUpdates runs the fenced workload under each fault that
// does not lose Redis data.
func TestFencedNoLostUpdates(t *testing.T) {
	t.Parallel()
	every := []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable}
	everySQL := []sql.IsolationLevel{sql.LevelDefault, sql.LevelReadCommitted, sql.LevelRepeatableRead, sql.LevelSerializable}
	pgDefault, myDefault, pgOne, myOne := isoLevels[1+rand.IntN(2)], drawLevel(), drawLevel(), drawLevel()
	pgsqlDefault, pgsqlOne := isoLevels[1+rand.IntN(2)], drawLevel()
	for _, st := range []storage{redisStorage(), postgresStorage(), mysqlStorage(),
		// Every level mixed, each transaction's drawn, the database's or
		// the sessions' default changed; and one level alone, drawn.
		postgresLevelsStorage("postgres at every isolation level", pgDefault, every...),
		mysqlLevelsStorage("mysql at every isolation level", myDefault, everySQL...),
		postgresLevelsStorage("postgres at "+pgOne, pgOne),
		mysqlLevelsStorage("mysql at "+myOne, myOne),
		// The same through database/sql (storage/pgsql).
		pgsqlLevelsStorage("pgsql at every isolation level", pgsqlDefault, everySQL...),
		pgsqlLevelsStorage("pgsql at "+pgsqlOne, pgsqlOne),
	} {
		t.Run(st.name+"/pause past the lease", func(t *testing.T) {
			res := run(t, workload.Config{Locker: sharedLocker(t), Counter: st.make(t), Mode: workload.Fenced})
			requireSafe(t, res)
			requireLevels(t, st, res)
		})
		t.Run(st.name+"/delayed write", func(t *testing.T) {
			res := run(t, workload.Config{
				Locker: sharedLocker(t), Counter: st.make(t), Mode: workload.Fenced,
				Pause: func(*rand.Rand) time.Duration { return 0 },
				DelayWrite: func(r *rand.Rand) time.Duration {
					if r.IntN(3) == 0 {
						return 3 * ttl
					}
					return 0
				},
			})
			requireSafe(t, res)
			requireLevels(t, st, res)
		})
	}
}

// TestFencedSurvivesRedisDataLoss kills or flushes the lock's Redis midway.
// The lock's token state is gone, and nobody calls Advance: the next grants'
// tokens come from the server's clock, above every token storage has seen,
// so writes are admitted again by themselves. It reports the time from the
// fault to the first admitted write.
func TestFencedSurvivesRedisDataLoss(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	faults := []struct {
		name  string
		fault func(srv *testenv.RedisServer) func(ctx context.Context)
	}{
		{"kill -9 and restart", func(srv *testenv.RedisServer) func(ctx context.Context) {
			return func(ctx context.Context) {
				if sleepCtx(ctx, 300*time.Millisecond) {
					srv.Kill()
					time.Sleep(50 * time.Millisecond)
					srv.Restart() // no persistence: every lock and token state is gone
				}
			}
		}},
		{"flushall", func(srv *testenv.RedisServer) func(ctx context.Context) {
			return func(ctx context.Context) {
				if sleepCtx(ctx, 300*time.Millisecond) {
					srv.Flush()
				}
			}
		}},
	}
	for _, st := range []storage{redisStorage(), postgresStorage(), mysqlStorage()} {
		for _, f := range faults {
			t.Run(st.name+"/"+f.name, func(t *testing.T) {
				srv := testenv.StartRedis(t) // the lock's Redis; data stays elsewhere
				l, err := lock.New(srv.Client())
				if err != nil {
					t.Fatal(err)
				}
				res := run(t, workload.Config{Locker: l, Counter: st.make(t), Mode: workload.Fenced, Fault: f.fault(srv), ProgressWithin: progressWithin})
				requireSafe(t, res)
				if res.AckedAfterFault == 0 {
					t.Fatalf("no write succeeded after the fault: no progress: %v", res)
				}
				t.Logf("%s: first admitted write %v after the fault", f.name, res.FirstAckAfterFault)
			})
		}
	}
}

// TestFencedSurvivesPostgresBackendTermination kills the pool's server
// backends again and again while the workload runs. Writes cut off without
// an answer are uncertain; none of the acknowledged ones may be lost.
func TestFencedSurvivesPostgresBackendTermination(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	app := "fencekit-e2e-" + time.Now().Format("150405.000000")
	pool := migratedPool(t, app)
	admin, err := pgxpool.New(ctx, testenv.PostgresBaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	var killed int64
	res := run(t, workload.Config{
		Locker: sharedLocker(t), Counter: &workload.PostgresCounter{Pool: pool}, Mode: workload.Fenced,
		// The terminations take the first 600ms; the rest is for progress,
		// which a loaded machine (CI after other runs) was seen to need more
		// than the default run's other 600ms for.
		Duration: recoveryRun(t),
		Fault: func(ctx context.Context) {
			// Terminate for the first 600ms, then let it recover.
			for i := 0; i < 6 && sleepCtx(ctx, 100*time.Millisecond); i++ {
				var n int64
				_ = admin.QueryRow(context.Background(),
					`SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n)
				killed += n
			}
		},
	})
	requireSafe(t, res)
	if killed == 0 {
		t.Fatalf("no backend was terminated: the fault did not happen: %v", res)
	}
	t.Logf("terminated %d backends", killed)
	if res.AckedAfterFault == 0 {
		t.Fatalf("no write succeeded after the terminations: no progress: %v", res)
	}
}

// TestFencedSurvivesMySQLConnectionKills kills the workload's server
// connections (KILL CONNECTION) again and again while it runs, cutting
// guards, reads, writes and COMMITs short. Writes cut off without an answer
// are uncertain; none of the acknowledged ones may be lost.
func TestFencedSurvivesMySQLConnectionKills(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	ctx := context.Background()
	cfg := testenv.MySQLConfig(t)
	db := testenv.OpenMySQL(t, cfg)
	if err := migrations.UpMySQL(ctx, db); err != nil {
		t.Fatal(err)
	}
	admin := testenv.OpenMySQL(t, cfg.Clone())
	var killed int64
	res := run(t, workload.Config{
		Locker: sharedLocker(t), Counter: &workload.MySQLCounter{DB: db}, Mode: workload.Fenced,
		// Long enough to recover after the kills even on a loaded machine,
		// where each round of kills takes far longer than its pause.
		Duration: max(runFor(t), 3*time.Second),
		Fault: func(ctx context.Context) {
			// Kill for six rounds or one second, whichever ends first, then
			// let the workload recover for the rest of the run.
			stop := time.Now().Add(time.Second)
			for i := 0; i < 6 && time.Now().Before(stop) && sleepCtx(ctx, 100*time.Millisecond); i++ {
				rows, err := admin.QueryContext(context.Background(),
					`SELECT id FROM information_schema.PROCESSLIST WHERE db = ? AND id <> CONNECTION_ID()`, cfg.DBName)
				if err != nil {
					t.Error(err)
					return
				}
				var ids []int64
				for rows.Next() {
					var id int64
					if rows.Scan(&id) == nil {
						ids = append(ids, id)
					}
				}
				rows.Close()
				for _, id := range ids {
					// A connection that ended meanwhile is no error worth a
					// failure.
					if _, err := admin.ExecContext(context.Background(), `KILL CONNECTION `+strconv.FormatInt(id, 10)); err == nil {
						killed++
					}
				}
			}
		},
	})
	requireSafe(t, res)
	if killed == 0 {
		t.Fatalf("no connection was killed: the fault did not happen: %v", res)
	}
	t.Logf("killed %d connections", killed)
	if res.AckedAfterFault == 0 {
		t.Fatalf("no write succeeded after the kills: no progress: %v", res)
	}
}

// TestFencedSurvivesMySQLRestart kills a private MariaDB with SIGKILL
// midway and restarts it on the same data. Writes in flight are uncertain;
// InnoDB keeps every committed one, so no acknowledged increment may be
// lost, and writes resume once the server is back.
func TestFencedSurvivesMySQLRestart(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	ctx := context.Background()
	srv := testenv.StartMySQL(t)
	db := testenv.OpenMySQL(t, srv.Config())
	if err := migrations.UpMySQL(ctx, db); err != nil {
		t.Fatal(err)
	}
	res := run(t, workload.Config{
		Locker: sharedLocker(t), Counter: &workload.MySQLCounter{DB: db}, Mode: workload.Fenced,
		Duration: max(runFor(t), 3*time.Second), // a restart with crash recovery takes a while
		// Crash recovery under load can outlast the run: writes must
		// resume within the bound, however long the restart took.
		ProgressWithin: progressWithin,
		Fault: func(ctx context.Context) {
			if sleepCtx(ctx, 300*time.Millisecond) {
				srv.Kill()
				time.Sleep(100 * time.Millisecond)
				srv.Restart()
			}
		},
	})
	requireSafe(t, res)
	if res.AckedAfterFault == 0 {
		t.Fatalf("no write succeeded after the restart: no progress: %v", res)
	}
	t.Logf("first admitted write %v after the restart", res.FirstAckAfterFault)
}

// TestNegativeControlsLoseUpdates runs the same workload without fenced
// reads, and without any fencing: both must lose increments, which shows the
// checker can see a loss.
func TestNegativeControlsLoseUpdates(t *testing.T) {
	t.Parallel()
	for _, st := range []storage{redisStorage(), postgresStorage(), mysqlStorage()} {
		for _, mode := range []workload.Mode{workload.Plain, workload.UnfencedReads} {
			t.Run(st.name+"/"+mode.String(), func(t *testing.T) {
				// Losses are random; a few runs make seeing one near certain.
				for range 5 {
					res := run(t, workload.Config{Locker: sharedLocker(t), Counter: st.make(t), Mode: mode})
					if res.Lost > 0 || res.Regressions > 0 {
						return
					}
				}
				t.Fatal("no lost update seen without fencing: the suite cannot see what it claims to prevent")
			})
		}
	}
}

// sleepCtx sleeps for d and reports whether ctx was still live by then.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}
