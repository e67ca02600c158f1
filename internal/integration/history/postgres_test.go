package history

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/internal/pgcore"
	"github.com/fencekit/fencekit/lock"
	"github.com/fencekit/fencekit/migrations"
	"github.com/fencekit/fencekit/storage/postgres"
)

// pgVariant selects what the workers run: the guards as they are, or a
// deliberately broken variant that the checker must reject.
type pgVariant int

const (
	// pgSound is the guards as shipped.
	pgSound pgVariant = iota
	// pgNoGuard runs Exec's write without the guard.
	pgNoGuard
	// pgReadOutside reads the row for InTx's read-modify-write before the
	// guarded transaction, not in it.
	pgReadOutside
	// pgTokenGE admits by token >= instead of >, in the guard, the batch
	// guard's function and the row-level admission.
	pgTokenGE
	// pgNoHolder admits a fence with the mark's token whatever its holder,
	// in the same three places.
	pgNoHolder
	// pgNoRowLock guards a transaction by reading the mark without a lock,
	// deciding in the client, then writing the mark (unlockedGuard).
	pgNoRowLock
	// pgOnceAfter runs Once's work first and records its completion after,
	// in a transaction of its own (onceAfter).
	pgOnceAfter
	// pgSnapshot judges the holder of the mark from the statement's
	// snapshot instead of the row version its lock returns: the guard
	// statement locks the row but admits the mark's fence as its snapshot
	// shows it (pgSnapshotGuardSQL), and the batch guard's function reads
	// the mark without FOR UPDATE. A holder whose mark a newer holder
	// raised while it waited is admitted.
	pgSnapshot
	// pgLockOnly is the guard before it wrote its row on every admission:
	// the fence that holds the mark only locks the row (migration 00005's
	// functions, called as the guards called them then), and every
	// transaction runs at REPEATABLE READ. A newer holder whose guard waited
	// on that lock is admitted with a snapshot older than the older
	// holder's commit, and its plain read returns the value before it.
	pgLockOnly
	// pgRRShape is the guards as shipped, run in pgLockOnly's shape: every
	// transaction at REPEATABLE READ, txread a plain read (which returns
	// the transaction's snapshot) and the first call of every session,
	// every session raced by the previous grant's holder, and no unfenced
	// writer (UpdateVersion, Table.Update): a plain read at REPEATABLE READ
	// misses an unfenced write committed after its snapshot, which the
	// model cannot tell from a lost fence. The sound guards must pass it.
	pgRRShape
)

// pgLockOnlySQL is what the guards sent before they wrote their row on
// every admission: the calls of the functions of migrations 00005 and
// 00009, which only lock the row under the fence that holds the mark.
var pgLockOnlySQL = []sqlBreak{
	{pgcore.GuardAdmitSQL, "SELECT fencekit_guard_admit($1, $2, $3)"},
	{pgcore.GuardJudgeSQL, "SELECT admitted, top_level, mark_token, mark_holder FROM fencekit_guard_judge($1, $2, $3)"},
	{pgcore.GuardSQL, "SELECT true WHERE fencekit_guard_try($1, $2, $3)"},
}

// pgLevels are the isolation levels a transaction of the workload runs at,
// one drawn for each (pgRRShape and pgLockOnly run every one at
// REPEATABLE READ). txread reads with FOR SHARE here, which at REPEATABLE
// READ and above fails (40001) on a row written after the snapshot. Every run counts what it judged at each ("tx at <level>": txrmw
// and txread calls answered, refusals and serialization failures
// included) and fails one that judged too few of a level.
var pgLevels = []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable}

// pgBreaks is the statement changes of each SQL-changing variant: the
// first is made in the guard functions of migration 00005 (the batch's and
// the transactions', which share their text), the second in Table's
// row-level admission, sent as a statement.
var pgBreaks = map[pgVariant][]sqlBreak{
	pgTokenGE: {
		{"WHERE EXCLUDED.token > g.token", "WHERE EXCLUDED.token >= g.token"},
		{`"fence_token" < $2 OR`, `"fence_token" <= $2 OR`},
	},
	pgNoHolder: {
		{"(EXCLUDED.token = g.token AND EXCLUDED.holder = g.holder)", "(EXCLUDED.token = g.token)"},
		{`("fence_token" = $2 AND "fence_holder" = $3)`, `("fence_token" = $2)`},
	},
	// The transactions' guard statement is replaced whole (snapshotGuard),
	// the batch's function by this change.
	pgSnapshot: {
		{"WHERE g.resource = p_resource FOR UPDATE;", "WHERE g.resource = p_resource;"},
	},
	pgLockOnly: pgLockOnlySQL,
}

// pgDB is what the workers' guarded calls take: a pool, or a pool that
// breaks the guards' statements (breakingDB).
type pgDB interface {
	postgres.Querier
	postgres.Beginner
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
	postgres.Batcher
}

const (
	pgWorkers   = 6
	pgKeySlots  = 2
	pgKeyOps    = 150
	pgKeyOpen   = 10
	pgRows      = 1000 // rows created up front; each key is one (a run uses a few dozen at most)
	pgCallLimit = 2 * time.Second
	pgHold      = 300 * time.Millisecond
)

const (
	pgReadSQL = `SELECT k.val, k.version, k.fence_token, k.fence_holder, g.token, g.holder
FROM kv k LEFT JOIN fencekit_guard g ON g.resource = $2 WHERE k.key = $1`
	pgLockedReadSQL = `SELECT val, version FROM kv WHERE key = $1 FOR UPDATE`
	pgSharedReadSQL = `SELECT val, version FROM kv WHERE key = $1 FOR SHARE`
	// pgTxSharedReadSQL is pgSharedReadSQL in pgPlainReadSQL's columns.
	pgTxSharedReadSQL = `SELECT val, version, false FROM kv WHERE key = $1 FOR SHARE`
	// pgPlainReadSQL also says whether the version read was already
	// superseded by a committed write when read (its xmax set): a read
	// from a snapshot that missed it, counted as the lock-only control
	// going wrong (a legitimate concurrent row write can do the same, so it
	// only sets how long the control runs).
	pgPlainReadSQL = `SELECT val, version, xmax::text <> '0' FROM kv WHERE key = $1`
	pgWriteSQL     = `UPDATE kv SET val = $2, version = version + 1 WHERE key = $1`
)

var pgTable = postgres.Table{Name: pgx.Identifier{"kv"}, Key: "key"}

type pgRun struct {
	t        testing.TB
	b        Budget
	variant  pgVariant
	rec      *Recorder
	locker   *lock.Locker
	keys     *keyRing
	holders  sync.Map // key -> the holder of the latest grant a worker took on it
	fences   sync.Map // key -> the fence of the latest grant a worker took on it
	onceLast sync.Map // key -> the key of work (1 to PgOnceKeys) of the latest Once on it

	oncePrefix string // Once's keys of work of this run

	proxies []*testenv.Proxy
	pools   []*pgxpool.Pool
	dbs     []pgDB // the pools, or for a broken variant the pools that break the guards
	admin   *pgxpool.Pool

	kills    atomic.Int64
	stale    atomic.Int64
	conflict atomic.Int64
	aborted  atomic.Int64
	leases   atomic.Int64
	pauses   atomic.Int64
	latency  atomic.Int64
	unmarked atomic.Int64 // open calls that may have written, whose error does not match fence.ErrOutcomeUnknown
	exposed  atomic.Int64 // broken variants: writes that went wrong (see minExposed)
	swapped  atomic.Int64 // SQL-changing variants: statements sent broken
	resolved atomic.Int64 // Once calls whose outcome was unknown, then told by a retry

	levelMu  sync.Mutex
	levelRng *rand.Rand                       // draws each transaction's isolation level
	atLevel  map[pgx.TxIsoLevel]*atomic.Int64 // txrmw and txread calls answered at each level
	dbLevel  pgx.TxIsoLevel                   // the database's default_transaction_isolation

	mu   sync.Mutex
	errs map[string]int
}

type pgResult struct {
	ops     []porcupine.Operation
	calls   int
	open    int
	keys    int
	faults  testenv.ProxyFaults
	kills   int64
	exposed int64
	took    time.Duration // how long the workers ran: the budget, or longer for a control (see runContext)
	verdict Verdict
	judged  Judgments
}

// pgRates is the least a run of the PostgreSQL checker must judge of each
// kind (see PgKinds) per second: a third or less of what a two-core machine
// makes under a load of 40 (about eight calls a second).
var pgRates = Rates{
	"tx at " + string(pgx.ReadCommitted): 0.05, "tx at " + string(pgx.RepeatableRead): 0.05, "tx at " + string(pgx.Serializable): 0.05,
	PgRead: 0.25, PgTxRMW: 0.3, PgTxRead: 0.05, PgQuery: 0.05, PgExec: 0.2, PgRowUpd: 0.2, PgRowMark: 0.05, PgUV: 0.25, PgOnce: 0.3,
	"stale refused": 0.1, "conflict": 0.05, "open placed": 0.1, "once ran": 0.03, "once done already": 0.03, "once unknown resolved": 0.03,
	"attack " + AttackOtherHolder: 0.03, "attack " + AttackOlderToken: 0.03, "attack " + AttackStolen: 0.03, "attack " + AttackRacing: 0.05,
}

func TestPostgresLinearizable(t *testing.T) {
	t.Parallel()
	b := BudgetFor(t)
	res := runPostgres(t, b, pgSound)
	reportPostgres(t, res)
	res.judged.Require(t, "postgres", pgRates.For(b.Duration))
	if res.faults.Lost+res.faults.Held+res.faults.Cut+int(res.kills) == 0 {
		t.Fatalf("no fault was injected in %v (seed %d): the run proves nothing", b.Duration, b.Seed)
	}
	switch res.verdict.Result {
	case porcupine.Illegal:
		t.Fatalf("PostgreSQL guard history is not linearizable (seed %d, replay with FENCEKIT_CHECK_SEED=%d); history: %s, rejected rows: %s",
			b.Seed, b.Seed, res.verdict.File, res.verdict.Text)
	case porcupine.Unknown:
		t.Fatalf("the checker ran out of time on the history (seed %d)", b.Seed)
	}
}

func reportPostgres(t testing.TB, res pgResult) {
	t.Helper()
	t.Logf("postgres: %d calls on %d rows in %v (%d left open), faults injected: %d backends terminated, %d replies lost, %d held for %v, %d connections cut; checked in %v: %s",
		res.calls, res.keys, res.took.Round(time.Millisecond), res.open, res.kills, res.faults.Lost, res.faults.Held, pgHold, res.faults.Cut, res.verdict.Took.Round(time.Millisecond), res.verdict.Result)
}

// pgSlot lets two PostgreSQL runs at a time work the server: more at once,
// each with its backends terminated every few hundred milliseconds, starve
// one another of connections, and none makes enough calls.
var pgSlot = make(chan struct{}, 2)

func runPostgres(t testing.TB, b Budget, variant pgVariant) pgResult {
	t.Helper()
	pgSlot <- struct{}{}
	defer func() { <-pgSlot }()
	ctx := context.Background()
	url, dbLevel := pgRunURL(t, b, variant)
	admin, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	db := stdlib.OpenDBFromPool(admin)
	if err := migrations.Up(ctx, db); err != nil {
		t.Fatalf("migrations: %v", err)
	}
	_ = db.Close()
	for _, sql := range []string{
		`CREATE TABLE kv (key text PRIMARY KEY, val text NOT NULL DEFAULT '', version bigint NOT NULL DEFAULT 0, fence_token bigint, fence_holder text)`,
		`INSERT INTO kv (key) SELECT 'k' || i FROM generate_series(1, ` + strconv.Itoa(pgRows) + `) AS i`,
	} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	prefix := testenv.Prefix(t)
	locker, err := lock.New(testenv.Redis(t), lock.WithPrefix(prefix+"l:"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(locker.Close)

	app := "fkcheck-" + strconv.FormatUint(rand.Uint64(), 36)
	r := &pgRun{t: t, b: b, variant: variant, rec: NewRecorder(), locker: locker, admin: admin, oncePrefix: app,
		keys: newKeyRing(pgKeySlots, pgKeyOps, pgKeyOpen), errs: map[string]int{},
		levelRng: rand.New(rand.NewPCG(b.Seed, 1<<34)), atLevel: map[pgx.TxIsoLevel]*atomic.Int64{}, dbLevel: dbLevel}
	for _, l := range pgLevels {
		r.atLevel[l] = new(atomic.Int64)
	}
	for range pgWorkers {
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		p := testenv.StartProxy(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
		host, port, _ := net.SplitHostPort(p.Addr())
		n, _ := strconv.Atoi(port)
		cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(n)
		cfg.ConnConfig.ConnectTimeout = 2 * time.Second
		cfg.ConnConfig.RuntimeParams["application_name"] = app
		cfg.MaxConns = 3 // a session and the older grant racing it, and one to spare
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		r.proxies, r.pools = append(r.proxies, p), append(r.pools, pool)
		if br, ok := pgBreaks[variant]; ok || variant == pgNoRowLock {
			r.dbs = append(r.dbs, breakingDB{Pool: pool, breaks: br, unlocked: variant == pgNoRowLock, snapshot: variant == pgSnapshot, functions: ok && variant != pgLockOnly, swapped: &r.swapped, exposed: &r.exposed})
		} else {
			r.dbs = append(r.dbs, pool)
		}
	}
	if br, ok := pgBreaks[variant]; ok && variant != pgLockOnly {
		breakAdmitFunction(t, admin, br[:1])
	}

	var exposed *atomic.Int64
	if variant != pgSound && variant != pgRRShape { // pgRRShape runs sound: for its budget
		exposed = &r.exposed
	}
	start := time.Now()
	rctx, cancel := runContext(b, exposed)
	defer cancel()
	var wg sync.WaitGroup
	for w := range pgWorkers {
		wg.Go(func() { r.worker(rctx, w) })
	}
	wg.Go(func() { r.killer(rctx, app, rand.New(rand.NewPCG(b.Seed, 1<<33))) })
	nemesis(rctx, r.proxies, rand.New(rand.NewPCG(b.Seed, 1<<32)), 150*time.Millisecond, pgHold, &r.latency)
	wg.Wait()
	took := time.Since(start)

	res := pgResult{ops: r.rec.Operations(), kills: r.kills.Load(), keys: r.keys.used(), exposed: r.exposed.Load(), took: took}
	res.judged = Tally(res.ops, PgKinds)
	res.judged["once unknown resolved"] = r.resolved.Load()
	for _, l := range pgLevels {
		res.judged["tx at "+string(l)] = r.atLevel[l].Load()
	}
	t.Logf("postgres: transactions judged by isolation level: %s %d, %s %d, %s %d",
		pgLevels[0], r.atLevel[pgLevels[0]].Load(), pgLevels[1], r.atLevel[pgLevels[1]].Load(), pgLevels[2], r.atLevel[pgLevels[2]].Load())
	if _, ok := pgBreaks[variant]; ok || variant == pgNoRowLock {
		brokenRan(t, r.swapped.Load(), res.judged[PgTxRMW]+res.judged[PgTxRead]+res.judged[PgOnce])
	}
	res.calls, res.open = r.rec.Counts()
	for _, p := range r.proxies {
		f := p.Faults()
		res.faults.Lost += f.Lost
		res.faults.Held += f.Held
		res.faults.Cut += f.Cut
	}
	name := "postgres"
	if variant != pgSound {
		name = fmt.Sprintf("postgres-control%d", variant)
	}
	res.verdict, err = Check(PgModel.ToModel(), res.ops, 3*time.Minute, name, b.Seed)
	if err != nil {
		t.Error(err)
	}
	t.Logf("postgres: %d leases, %d pauses past a lease, %d stale refusals, %d version conflicts, %d aborted, %d latency changes",
		r.leases.Load(), r.pauses.Load(), r.stale.Load(), r.conflict.Load(), r.aborted.Load(), r.latency.Load())
	t.Logf("postgres: errors that left calls open: %v", r.errs)
	checkUnmarked(t, "postgres", r.unmarked.Load())
	return res
}

// killer terminates one of the workers' backends every 100 to 500 ms.
func (r *pgRun) killer(ctx context.Context, app string, rng *rand.Rand) {
	for {
		t := time.NewTimer(time.Duration(100+rng.IntN(400)) * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		var killed bool
		err := r.admin.QueryRow(ctx, `SELECT coalesce(bool_or(pg_terminate_backend(pid)), false) FROM
			(SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid() ORDER BY random() LIMIT 1) AS victim`, app).Scan(&killed)
		if err == nil && killed {
			r.kills.Add(1)
		}
	}
}

func (r *pgRun) worker(ctx context.Context, w int) {
	rng := rand.New(rand.NewPCG(r.b.Seed, uint64(w)))
	seq := 0
	data := func() string { seq++; return fmt.Sprintf("w%d.%d", w, seq) }
	lastVersion := map[string]int64{}
	for ctx.Err() == nil {
		key := r.keys.pick(rng)
		if rng.IntN(2) == 0 {
			r.session(ctx, w, rng, key, data)
			continue
		}
		cctx, cancel := context.WithTimeout(context.Background(), pgCallLimit)
		// Most often a read, then most often an optimistic write at the
		// version last read (which may be older than the row's).
		if rng.IntN(4) != 0 {
			if out := r.read(cctx, w, key); out.Status == Ok {
				lastVersion[key] = out.Version
			}
		}
		if rng.IntN(3) != 0 && !r.rrShape() {
			in := PgIn{Key: key, Op: PgUV, Expected: lastVersion[key], Data: data()}
			c := r.invoke(w, in)
			v, err := pgTable.UpdateVersion(cctx, r.pools[w], key, in.Expected, postgres.Set("val", in.Data))
			out := r.outcome(in, err)
			if out.Status == Ok {
				out.Version = v
			}
			r.finish(c, out)
		}
		cancel()
	}
}

func (r *pgRun) session(ctx context.Context, w int, rng *rand.Rand, key string, data func() string) {
	ttl := time.Duration(50+rng.IntN(100)) * time.Millisecond
	actx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	lease, err := r.locker.Acquire(actx, "r-"+key, ttl)
	cancel()
	if err != nil {
		return
	}
	r.leases.Add(1)
	defer func() {
		rctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = lease.Release(rctx)
		cancel()
	}()
	f := lease.Fence()
	defer raceOlder(rng, &r.fences, &r.holders, key, f, data, r.rrShape(), func(ctx context.Context, p fence.Fence, d string) {
		r.txRMW(ctx, w, key, p, d, AttackRacing)
	}).Wait()
	// The lock-only control races every older grant with a read at
	// REPEATABLE READ sent a little after it: the shape that variant gets
	// wrong (the newer guard waits on the older holder's row lock).
	lockOnlyRead := r.rrShape()
	for range 1 + rng.IntN(4) {
		if lockOnlyRead {
			lockOnlyRead = false
			time.Sleep(time.Duration(1+rng.IntN(5)) * time.Millisecond)
			cctx, cancel := context.WithTimeout(context.Background(), pgCallLimit)
			out := r.txRead(cctx, w, key, f)
			cancel()
			if out.Status == Stale {
				return
			}
			continue
		}
		if rng.IntN(5) == 0 {
			r.pauses.Add(1)
			time.Sleep(ttl + time.Duration(rng.IntN(30))*time.Millisecond)
		}
		cctx, cancel := context.WithTimeout(context.Background(), pgCallLimit)
		var out PgOut
		row := false // the call's mark is the row's, not the guard's
		switch n := rng.IntN(100); {
		case n < 20:
			out = r.txRMW(cctx, w, key, f, data(), "")
		case n < 27:
			out = r.txRead(cctx, w, key, f)
		case n < 34:
			out = r.query(cctx, w, key, f)
		case n < 50:
			out = r.exec(cctx, w, key, f, data(), "")
		case r.rrShape() && n < 74:
			out = r.txRMW(cctx, w, key, f, data(), "") // no unfenced writer in this shape
		case n < 66:
			out, row = r.rowUpdate(cctx, w, key, f, data(), ""), true
		case n < 74:
			out, row = r.rowUpdate(cctx, w, key, f, "", ""), true
		default:
			out = r.once(w, rng, key, f, data())
		}
		cancel()
		if out.Status == Stale {
			return
		}
		if out.Status == Ok && rng.IntN(2) == 0 {
			r.attack(w, rng, key, f, row, data())
		}
	}
}

// raceOlder records f as the latest grant of key (fences: key -> fence,
// holders: key -> holder) and, in one session in four (in every one when
// always is set), starts the holder of
// the previous grant, woken late, on a read-modify-write under its fence
// (rmw, with data d), racing the session's first call. The guard must order
// them: one of the two is refused, or the older runs wholly first. The
// session waits for the race it returns before it ends.
func raceOlder(rng *rand.Rand, fences, holders *sync.Map, key string, f fence.Fence, data func() string, always bool, rmw func(ctx context.Context, p fence.Fence, d string)) *sync.WaitGroup {
	prev, _ := fences.Swap(key, f)
	holders.Store(key, f.Holder)
	race := new(sync.WaitGroup)
	if p, ok := prev.(fence.Fence); ok && (always || rng.IntN(4) == 0) {
		d := data()
		race.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), pgCallLimit)
			defer cancel()
			rmw(ctx, p, d)
		})
	}
	return race
}

// rowUpdate is Table.Update: with d, a write of the value under the row's
// own mark; without, a raise of the mark alone.
func (r *pgRun) rowUpdate(ctx context.Context, w int, key string, f fence.Fence, d, attack string) PgOut {
	in := PgIn{Key: key, Op: PgRowUpd, Fence: markOf(f), Data: d, Attack: attack}
	var values []postgres.Assignment
	if d == "" {
		in.Op = PgRowMark
	} else {
		values = append(values, postgres.Set("val", d))
	}
	c := r.invoke(w, in)
	err := pgTable.Update(ctx, r.dbs[w], f, key, values...)
	return r.finish(c, r.outcome(in, err))
}

// attack offers, right after f was admitted on key (by the row's own mark
// when row is set, else by the guard), a fence that no lock issued (see
// the Attack constants): a sound guard refuses each, since the mark is f
// or newer. One that is admitted counts as gone wrong.
func (r *pgRun) attack(w int, rng *rand.Rand, key string, f fence.Fence, row bool, d string) {
	forged, kind := forge(w, rng, &r.holders, key, f)
	ctx, cancel := context.WithTimeout(context.Background(), pgCallLimit)
	defer cancel()
	var out PgOut
	switch {
	case row:
		out = r.rowUpdate(ctx, w, key, forged, d, kind)
	case rng.IntN(2) == 0:
		out = r.exec(ctx, w, key, forged, d, kind)
	default:
		out = r.txRMW(ctx, w, key, forged, d, kind)
	}
	if out.Status == Ok {
		r.exposed.Add(1)
	}
}

// forge makes, from f just admitted on key, a fence that no lock issued:
// another holder's name on f's token, an older token, or the holder of the
// latest grant on key (holders: key -> holder) on f's token. It returns the
// fence and its kind (an Attack constant).
func forge(w int, rng *rand.Rand, holders *sync.Map, key string, f fence.Fence) (fence.Fence, string) {
	forged := f
	var kind string
	switch rng.IntN(3) {
	case 0:
		kind, forged.Holder = AttackOtherHolder, fmt.Sprintf("forged-w%d-%d", w, rng.Uint32())
	case 1:
		kind, forged.Token = AttackOlderToken, f.Token-1-fence.Token(rng.IntN(3))
	default:
		kind = AttackStolen
		if h, ok := holders.Load(key); ok && h.(string) != f.Holder {
			forged.Holder = h.(string)
		} else {
			forged.Holder = fmt.Sprintf("other-w%d-%d", w, rng.Uint32())
		}
	}
	return forged, kind
}

// once runs Once on one of the row's keys of work (1 to PgOnceKeys) with
// work that writes the row, as exec does. One call in four has a deadline
// of a few milliseconds, to end it while COMMIT is in flight. A call whose
// outcome is unknown is left open and retried with the same fence and
// work, up to three times: the retry tells whether the first ran.
func (r *pgRun) once(w int, rng *rand.Rand, key string, f fence.Fence, d string) PgOut {
	idx, okey := onceKey(rng, &r.onceLast, r.oncePrefix, key)
	in := PgIn{Key: key, Op: PgOnce, Fence: markOf(f), Once: idx, Data: d}
	return onceCall(r, w, rng, r.proxies[w], in, &r.resolved, func(ctx context.Context, late func()) (bool, error) {
		work := func(ctx context.Context, tx pgx.Tx) error {
			var was string
			if err := tx.QueryRow(ctx, pgLockedReadSQL, key).Scan(&was, new(int64)); err != nil {
				return err
			}
			if was == d {
				// An earlier try of this call ran the work already: it
				// runs again (only a broken Once lets it).
				r.exposed.Add(1)
			}
			_, err := tx.Exec(ctx, pgWriteSQL, key, d)
			late()
			return err
		}
		if r.variant == pgOnceAfter {
			return onceAfter(ctx, r.dbs[w], f, okey, work, &r.exposed)
		}
		return postgres.Once(ctx, r.dbs[w], f, okey, work)
	})
}

// pgCaller records the calls of a PostgreSQL workload (pgRun, sqlRun).
type pgCaller interface {
	invoke(w int, in PgIn) pgCall
	outcome(in PgIn, err error) PgOut
	finish(c pgCall, out PgOut) PgOut
}

// onceCall records the tries of the Once call in of worker w, each run by
// try with a call's time of its own (a retry after a lost reply starts on
// a new connection) and late, which the work calls after its write. One
// first try in eight has late end its context a moment later, while
// COMMIT is on its way; four in eight have late lose the next reply on
// proxy, COMMIT's. A try whose outcome is unknown is left open and retried
// with the same fence and work, up to three times: the retry tells whether
// the first ran (counted in resolved).
func onceCall(rc pgCaller, w int, rng *rand.Rand, proxy *testenv.Proxy, in PgIn, resolved *atomic.Int64, try func(ctx context.Context, late func()) (bool, error)) PgOut {
	var out PgOut
	for n := range 4 {
		ctx, cancel := context.WithTimeout(context.Background(), pgCallLimit)
		mode := -1
		if n == 0 {
			mode = rng.IntN(8)
		}
		late := func() {
			switch mode {
			case 0:
				time.AfterFunc(time.Duration(rng.IntN(2000))*time.Microsecond, cancel)
			case 1, 2, 3, 4:
				proxy.LoseNextReply(nil)
			}
		}
		c := rc.invoke(w, in)
		ran, err := try(ctx, late)
		cancel()
		out = rc.outcome(in, err)
		if out.Status == Ok {
			out.Ran = ran
		}
		rc.finish(c, out)
		if out.Status != Unknown {
			if n > 0 {
				resolved.Add(1)
			}
			return out
		}
	}
	return out
}

// onceKey picks the key of work (1 to PgOnceKeys) of a Once call on key,
// and its name under prefix. Half the calls run the key of work that ran
// last on this row (onceLast: key -> key of work) again: its record must
// make it change nothing (the run finds it done).
func onceKey(rng *rand.Rand, onceLast *sync.Map, prefix, key string) (int, string) {
	idx := 1 + rng.IntN(PgOnceKeys)
	if last, ok := onceLast.Load(key); ok && rng.IntN(2) == 0 {
		idx = last.(int)
	}
	onceLast.Store(key, idx)
	return idx, fmt.Sprintf("%s/%s/%d", prefix, key, idx)
}

func (r *pgRun) read(ctx context.Context, w int, key string) PgOut {
	in := PgIn{Key: key, Op: PgRead}
	c := r.invoke(w, in)
	var out PgOut
	var rtok, gtok *int64
	var rhold, ghold *string
	err := r.pools[w].QueryRow(ctx, pgReadSQL, key, "r-"+key).Scan(&out.Data, &out.Version, &rtok, &rhold, &gtok, &ghold)
	res := r.outcome(in, err)
	if res.Status != Ok {
		return r.finish(c, res)
	}
	out.Status = Ok
	out.Row, out.Guard = markFrom(rtok, rhold), markFrom(gtok, ghold)
	return r.finish(c, out)
}

func (r *pgRun) txRMW(ctx context.Context, w int, key string, f fence.Fence, d, attack string) PgOut {
	in := PgIn{Key: key, Op: PgTxRMW, Fence: markOf(f), Data: d, Attack: attack}
	c := r.invoke(w, in)
	var old PgOut
	var err error
	if r.variant == pgReadOutside {
		err = r.pools[w].QueryRow(ctx, pgLockedReadSQL, key).Scan(&old.Data, &old.Version)
		// A client pays round trips between its read and its guarded
		// write, and may be slow to send it: up to 10 ms here, as in the
		// Redis store's client-side control.
		time.Sleep(time.Duration(rand.IntN(10_000)) * time.Microsecond)
		// It went wrong if the row changed since that read: the write
		// then commits on a stale read. The test looks (locking the row,
		// as the write would) to count it; the write does not use it.
		var changed bool
		if err == nil {
			err = postgres.InTx(ctx, r.pools[w], pgx.TxOptions{}, f, func(ctx context.Context, tx pgx.Tx) error {
				var now int64
				if err := tx.QueryRow(ctx, `SELECT version FROM kv WHERE key = $1 FOR UPDATE`, key).Scan(&now); err != nil {
					return err
				}
				changed = now != old.Version
				_, err := tx.Exec(ctx, pgWriteSQL, key, d)
				return err
			})
		}
		if err == nil && changed {
			r.exposed.Add(1)
		}
	} else {
		level := r.level()
		err = postgres.InTx(ctx, r.dbs[w], pgx.TxOptions{IsoLevel: level}, f, func(ctx context.Context, tx pgx.Tx) error {
			if err := tx.QueryRow(ctx, pgLockedReadSQL, key).Scan(&old.Data, &old.Version); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, pgWriteSQL, key, d)
			return err
		})
		defer r.judgedAt(level, err)
	}
	out := r.outcome(in, err)
	if out.Status == Ok {
		out.Data, out.Version = old.Data, old.Version
	}
	return r.finish(c, out)
}

func (r *pgRun) txRead(ctx context.Context, w int, key string, f fence.Fence) PgOut {
	in := PgIn{Key: key, Op: PgTxRead, Fence: markOf(f)}
	c := r.invoke(w, in)
	var got PgOut
	level := r.level()
	// A locking read, or in the REPEATABLE READ shape a plain read, which
	// returns the transaction's snapshot: what the guard must have made
	// newer than every older holder's commit.
	read := pgTxSharedReadSQL
	if r.rrShape() {
		read = pgPlainReadSQL
	}
	err := postgres.InTx(ctx, r.dbs[w], pgx.TxOptions{IsoLevel: level}, f, func(ctx context.Context, tx pgx.Tx) error {
		var superseded bool
		err := tx.QueryRow(ctx, read, key).Scan(&got.Data, &got.Version, &superseded)
		if superseded && r.variant == pgLockOnly {
			r.exposed.Add(1)
		}
		return err
	})
	r.judgedAt(level, err)
	out := r.outcome(in, err)
	if out.Status == Ok {
		out.Data, out.Version = got.Data, got.Version
	}
	return r.finish(c, out)
}

func (r *pgRun) query(ctx context.Context, w int, key string, f fence.Fence) PgOut {
	in := PgIn{Key: key, Op: PgQuery, Fence: markOf(f)}
	c := r.invoke(w, in)
	var got PgOut
	rows := 0
	err := postgres.Query(ctx, r.dbs[w], f, postgres.Statement{SQL: pgSharedReadSQL, Args: []any{key}}, func(rs pgx.Rows) error {
		for rs.Next() {
			rows++
			if err := rs.Scan(&got.Data, &got.Version); err != nil {
				return err
			}
		}
		return rs.Err()
	})
	if err == nil && rows != 1 {
		err = fmt.Errorf("history: query read %d rows of %s", rows, key)
	}
	out := r.outcome(in, err)
	if out.Status == Ok {
		out.Data, out.Version = got.Data, got.Version
	}
	return r.finish(c, out)
}

func (r *pgRun) exec(ctx context.Context, w int, key string, f fence.Fence, d, attack string) PgOut {
	in := PgIn{Key: key, Op: PgExec, Fence: markOf(f), Data: d, Attack: attack}
	c := r.invoke(w, in)
	var err error
	if r.variant == pgNoGuard {
		// It went wrong if the guard had already admitted a newer fence:
		// the write of a superseded holder then lands. The statement
		// reads the guard's token to count it; the write does not use it.
		var newest *int64
		err = r.pools[w].QueryRow(ctx, pgWriteSQL+` RETURNING (SELECT token FROM fencekit_guard WHERE resource = $3)`, key, d, f.Resource).Scan(&newest)
		if err == nil && newest != nil && *newest > int64(f.Token) {
			r.exposed.Add(1)
		}
	} else {
		_, err = postgres.Exec(ctx, r.dbs[w], f, postgres.Statement{SQL: pgWriteSQL, Args: []any{key, d}})
	}
	return r.finish(c, r.outcome(in, err))
}

type pgCall struct {
	c   Call
	key string
}

// rrShape reports a run of the REPEATABLE READ shape (pgRRShape,
// pgLockOnly).
func (r *pgRun) rrShape() bool { return r.variant == pgLockOnly || r.variant == pgRRShape }

// pgRunURL is the URL a PostgreSQL checker's run works on: a schema of its
// own, whose database defaults to READ COMMITTED, in a third of the sound
// runs (by seed); in the others a database of its own whose
// default_transaction_isolation is REPEATABLE READ or SERIALIZABLE, so that
// the calls that take the default (Exec, Query, Once, Table, and the
// transactions drawn at the default) run at it. It returns that default.
func pgRunURL(t testing.TB, b Budget, variant pgVariant) (string, pgx.TxIsoLevel) {
	t.Helper()
	defaults := []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable}
	level := defaults[b.Seed%3]
	if variant != pgSound || level == pgx.ReadCommitted {
		return testenv.PostgresURL(t), pgx.ReadCommitted
	}
	u, drop := testenv.PostgresDatabase(t, testenv.PostgresBaseURL(t), "fk_history_")
	t.Cleanup(drop)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var name string
	if err := conn.QueryRow(ctx, `SELECT current_database()`).Scan(&name); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `ALTER DATABASE `+pgx.Identifier{name}.Sanitize()+` SET default_transaction_isolation = '`+string(level)+`'`); err != nil {
		t.Fatal(err)
	}
	t.Logf("postgres: the run's database defaults to %s", level)
	return u, level
}

// level draws the isolation level of a transaction: REPEATABLE READ for
// the lock-only control, any of pgLevels otherwise.
func (r *pgRun) level() pgx.TxIsoLevel {
	if r.rrShape() {
		return pgx.RepeatableRead
	}
	r.levelMu.Lock()
	defer r.levelMu.Unlock()
	if r.levelRng.IntN(4) == 0 {
		return "" // the database's default
	}
	return pgLevels[r.levelRng.IntN(len(pgLevels))]
}

// judgedAt counts a transaction at level whose answer the checker judges:
// admitted, refused, or rolled back (a serialization failure counts as a
// refusal, never as a lost write).
func (r *pgRun) judgedAt(level pgx.TxIsoLevel, err error) {
	if level == "" {
		level = r.dbLevel
	}
	var stale *fence.StaleError
	if err == nil || errors.As(err, &stale) || errors.Is(err, postgres.ErrRetryable) {
		r.atLevel[level].Add(1)
	}
}

func (r *pgRun) invoke(w int, in PgIn) pgCall {
	return pgCall{c: r.rec.Invoke(w, in), key: in.Key}
}

// outcome classifies err: ok, stale (with the mark it lost to, the guard's
// or the row's by the call), conflict, aborted (ErrRetryable: rolled back),
// or unknown for everything else.
func (r *pgRun) outcome(in PgIn, err error) PgOut {
	var out PgOut
	var stale *fence.StaleError
	var conflict *fence.ConflictError
	switch {
	case err == nil:
		out.Status = Ok
	case errors.As(err, &stale):
		m := Mark{Token: int64(stale.HighWater.Token), Holder: stale.HighWater.Holder}
		out.Status = Stale
		if in.Op == PgRowUpd || in.Op == PgRowMark {
			out.Row = m
		} else {
			out.Guard = m
		}
		r.stale.Add(1)
	case errors.As(err, &conflict):
		out.Status, out.Version = Conflict, conflict.Actual
		r.conflict.Add(1)
	case errors.Is(err, postgres.ErrRetryable):
		out.Status = Aborted
		r.aborted.Add(1)
	case errors.Is(err, fence.ErrNotFound), errors.Is(err, fence.ErrInvalid), errors.Is(err, postgres.ErrNotMigrated):
		r.t.Errorf("%s on %s: %v", in.Op, in.Key, err)
		out.Status = Unknown
	default:
		out.Status = Unknown
		if in.Op != PgRead && !errors.Is(err, fence.ErrOutcomeUnknown) {
			r.unmarked.Add(1)
			if takeAtWord {
				out.Status = Aborted // the store says it was not applied
			}
		}
		msg := err.Error()
		if i := strings.LastIndex(msg, ": "); i >= 0 {
			msg = msg[i+2:]
		}
		r.mu.Lock()
		r.errs[in.Op+": "+msg]++
		r.mu.Unlock()
	}
	return out
}

func (r *pgRun) finish(c pgCall, out PgOut) PgOut {
	if out.Status == Unknown {
		c.c.Open(out)
		r.keys.opened(c.key)
		return out
	}
	c.c.Return(out)
	return out
}

func markFrom(tok *int64, holder *string) Mark {
	var m Mark
	if tok != nil {
		m.Token = *tok
	}
	if holder != nil {
		m.Holder = *holder
	}
	return m
}
