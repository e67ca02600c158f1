package history

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "github.com/lib/pq"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
	"github.com/fencekit/fencekit/migrations"
	"github.com/fencekit/fencekit/storage/pgsql"
)

// The storage/pgsql checker: the PostgreSQL model (pgmodel.go) over the
// database/sql guard, with half the workers on pgx's stdlib and half on
// lib/pq, under the same faults as the pgx checker (lost and held replies,
// cut connections, terminated backends, pauses past a lease) and attacks
// (forged fences, the older grant racing the newer, Once with lost COMMIT
// replies). Exec and Query are pgx's alone; the rest is the same calls
// through database/sql.

// sqlWorkerDrivers are the database/sql drivers the workers take in turn.
var sqlWorkerDrivers = [...]string{"pgx", "postgres"}

var sqlTable = pgsql.Table{Name: "kv", Key: "key"}

type sqlRun struct {
	t       testing.TB
	b       Budget
	variant pgVariant
	rec     *Recorder
	locker  *lock.Locker
	keys    *keyRing

	holders  sync.Map // key -> the holder of the latest grant a worker took on it
	fences   sync.Map // key -> the fence of the latest grant a worker took on it
	onceLast sync.Map // key -> the key of work of the latest Once on it

	oncePrefix string // Once's keys of work of this run

	proxies []*testenv.Proxy
	dbs     []*sql.DB // for a broken variant, through a connector that breaks the guards
	admin   *sql.DB

	kills    atomic.Int64
	stale    atomic.Int64
	conflict atomic.Int64
	aborted  atomic.Int64
	leases   atomic.Int64
	pauses   atomic.Int64
	latency  atomic.Int64
	unmarked atomic.Int64
	exposed  atomic.Int64
	swapped  atomic.Int64 // SQL-changing variants: statements sent broken
	resolved atomic.Int64 // Once calls whose outcome was unknown, then told by a retry

	levelMu  sync.Mutex
	levelRng *rand.Rand                       // draws each transaction's isolation level
	atLevel  map[pgx.TxIsoLevel]*atomic.Int64 // txrmw and txread calls answered at each level
	dbLevel  pgx.TxIsoLevel                   // the database's default_transaction_isolation

	mu   sync.Mutex
	errs map[string]int
}

// sqlLevels are pgLevels as database/sql names them.
var sqlLevels = map[pgx.TxIsoLevel]sql.IsolationLevel{
	"": sql.LevelDefault, pgx.ReadCommitted: sql.LevelReadCommitted, pgx.RepeatableRead: sql.LevelRepeatableRead, pgx.Serializable: sql.LevelSerializable,
}

// rrShape reports a run of the REPEATABLE READ shape (pgRRShape,
// pgLockOnly).
func (r *sqlRun) rrShape() bool { return r.variant == pgLockOnly || r.variant == pgRRShape }

// level draws the isolation level of a transaction, as pgRun's does.
func (r *sqlRun) level() pgx.TxIsoLevel {
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

// judgedAt counts a transaction at level whose answer the checker judges,
// as pgRun's does.
func (r *sqlRun) judgedAt(level pgx.TxIsoLevel, err error) {
	if level == "" {
		level = r.dbLevel
	}
	var stale *fence.StaleError
	if err == nil || errors.As(err, &stale) || errors.Is(err, pgsql.ErrRetryable) {
		r.atLevel[level].Add(1)
	}
}

// pgsqlRates is the least a run of the pgsql checker must judge of each
// kind (see PgKinds) per second: about a third of what a two-core machine
// makes under load.
var pgsqlRates = Rates{
	"tx at " + string(pgx.ReadCommitted): 0.05, "tx at " + string(pgx.RepeatableRead): 0.05, "tx at " + string(pgx.Serializable): 0.05,
	PgRead: 0.25, PgTxRMW: 0.3, PgTxRead: 0.05, PgRowUpd: 0.2, PgRowMark: 0.05, PgUV: 0.25, PgOnce: 0.3,
	"stale refused": 0.1, "conflict": 0.05, "open placed": 0.1, "once ran": 0.03, "once done already": 0.03, "once unknown resolved": 0.03,
	"attack " + AttackOtherHolder: 0.03, "attack " + AttackOlderToken: 0.03, "attack " + AttackStolen: 0.03, "attack " + AttackRacing: 0.05,
}

func TestPgsqlLinearizable(t *testing.T) {
	t.Parallel()
	b := BudgetFor(t)
	res := runPgsql(t, b, pgSound)
	reportPgsql(t, res)
	res.judged.Require(t, "pgsql", pgsqlRates.For(b.Duration))
	if res.faults.Lost+res.faults.Held+res.faults.Cut+int(res.kills) == 0 {
		t.Fatalf("no fault was injected in %v (seed %d): the run proves nothing", b.Duration, b.Seed)
	}
	switch res.verdict.Result {
	case porcupine.Illegal:
		t.Fatalf("pgsql guard history is not linearizable (seed %d, replay with FENCEKIT_CHECK_SEED=%d); history: %s, rejected rows: %s",
			b.Seed, b.Seed, res.verdict.File, res.verdict.Text)
	case porcupine.Unknown:
		t.Fatalf("the checker ran out of time on the history (seed %d)", b.Seed)
	}
}

// TestPgsqlControlReadOutside runs the pgsql checker on an InTx
// read-modify-write whose read runs before the guarded transaction: it
// must reject most runs.
func TestPgsqlControlReadOutside(t *testing.T) {
	t.Parallel()
	rejectsMostIn(t, "pgsql: read outside the guarded transaction", pgsqlControlLeast, func(t *testing.T, b Budget) controlRun {
		res := runPgsql(t, b, pgReadOutside)
		reportPgsql(t, res)
		return controlRun{rejected: res.verdict.Result == porcupine.Illegal, exposed: res.exposed}
	})
}

// pgsqlControlLeast is the least a run of a pgsql control lasts: half the
// pgx controls' (pgControlLeast), since the pgsql workload makes about
// twice their calls a second, and the runs share pgSlot with them.
const pgsqlControlLeast = 3 * time.Second

// pgsqlBrokenControl runs the pgsql checker on a broken variant of the
// guards: it must reject most runs.
func pgsqlBrokenControl(t *testing.T, name string, variant pgVariant) {
	budgetedOnly(t)
	t.Parallel()
	pgsqlRejectsMost(t, name, variant)
}

// pgsqlRejectsMost is pgsqlBrokenControl's check, in the caller's test.
func pgsqlRejectsMost(t *testing.T, name string, variant pgVariant) {
	rejectsMostIn(t, name, pgsqlControlLeast, func(t *testing.T, b Budget) controlRun {
		res := runPgsql(t, b, variant)
		reportPgsql(t, res)
		res.judged.Require(t, "pgsql control", nil)
		return controlRun{rejected: res.verdict.Result == porcupine.Illegal, exposed: res.exposed}
	})
}

// TestPgsqlControlTokenGE: the guard and the row-level admission admit by
// token >= instead of >.
func TestPgsqlControlTokenGE(t *testing.T) {
	pgsqlBrokenControl(t, "pgsql guards admitting token >=", pgTokenGE)
}

// TestPgsqlControlNoHolder: the guards admit the mark's token whatever the
// holder.
func TestPgsqlControlNoHolder(t *testing.T) {
	pgsqlBrokenControl(t, "pgsql guards without the holder compare", pgNoHolder)
}

// TestPgsqlControlNoRowLock: a guard that reads the mark without a row
// lock, decides, then writes it.
func TestPgsqlControlNoRowLock(t *testing.T) {
	pgsqlBrokenControl(t, "pgsql guard without the row lock", pgNoRowLock)
}

// TestPgsqlControlSnapshot: a guard that locks the row but judges the
// holder of the mark from its statement's snapshot.
func TestPgsqlControlSnapshot(t *testing.T) {
	pgsqlBrokenControl(t, "pgsql guard judging from its snapshot", pgSnapshot)
}

// TestPgsqlControlOnceAfter: a Once that runs the work, then records it in
// a transaction of its own.
func TestPgsqlControlOnceAfter(t *testing.T) {
	pgsqlBrokenControl(t, "pgsql Once recording after the work", pgOnceAfter)
}

func reportPgsql(t testing.TB, res pgResult) {
	t.Helper()
	t.Logf("pgsql: %d calls on %d rows in %v (%d left open), faults injected: %d backends terminated, %d replies lost, %d held for %v, %d connections cut; checked in %v: %s",
		res.calls, res.keys, res.took.Round(time.Millisecond), res.open, res.kills, res.faults.Lost, res.faults.Held, pgHold, res.faults.Cut, res.verdict.Took.Round(time.Millisecond), res.verdict.Result)
}

func runPgsql(t testing.TB, b Budget, variant pgVariant) pgResult {
	t.Helper()
	pgSlot <- struct{}{}
	defer func() { <-pgSlot }()
	ctx := context.Background()
	base, dbLevel := pgRunURL(t, b, variant)
	admin, err := sql.Open("pgx", base)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close() })
	if err := migrations.Up(ctx, admin); err != nil {
		t.Fatalf("migrations: %v", err)
	}
	if br, ok := pgBreaks[variant]; ok && variant != pgLockOnly {
		// The guard's rule runs in fencekit_guard_try: break it there.
		for _, fn := range brokenGuardFunctions(t, br[:1]) {
			if _, err := admin.ExecContext(ctx, fn); err != nil {
				t.Fatalf("broken variant: %v", err)
			}
		}
	}
	for _, q := range []string{
		`CREATE TABLE kv (key text PRIMARY KEY, val text NOT NULL DEFAULT '', version bigint NOT NULL DEFAULT 0, fence_token bigint, fence_holder text)`,
		`INSERT INTO kv (key) SELECT 'k' || i FROM generate_series(1, ` + strconv.Itoa(pgRows) + `) AS i`,
	} {
		if _, err := admin.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	locker, err := lock.New(testenv.Redis(t), lock.WithPrefix(testenv.Prefix(t)+"l:"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(locker.Close)

	app := "fkcheck-" + strconv.FormatUint(rand.Uint64(), 36)
	r := &sqlRun{t: t, b: b, variant: variant, rec: NewRecorder(), locker: locker, admin: admin, oncePrefix: app,
		keys: newKeyRing(pgKeySlots, pgKeyOps, pgKeyOpen), errs: map[string]int{},
		levelRng: rand.New(rand.NewPCG(b.Seed, 1<<34)), atLevel: map[pgx.TxIsoLevel]*atomic.Int64{}, dbLevel: dbLevel}
	for _, l := range pgLevels {
		r.atLevel[l] = new(atomic.Int64)
	}
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	for w := range pgWorkers {
		p := testenv.StartProxy(t, u.Host)
		pu := *u
		pu.Host = p.Addr()
		q := pu.Query()
		q.Set("application_name", app)
		q.Set("connect_timeout", "2")
		pu.RawQuery = q.Encode()
		db, err := sql.Open(sqlWorkerDrivers[w%len(sqlWorkerDrivers)], pu.String())
		if err != nil {
			t.Fatal(err)
		}
		if br, ok := pgBreaks[variant]; ok || variant == pgNoRowLock {
			_ = db.Close()
			conn := dsnConnector{drv: db.Driver(), dsn: pu.String()}
			db = sql.OpenDB(pgsqlConnector{unlocked: variant == pgNoRowLock, snapshot: variant == pgSnapshot,
				breakingConnector: breakingConnector{Connector: conn, breaks: br, swapped: &r.swapped, exposed: &r.exposed}})
		}
		db.SetMaxOpenConns(3) // a session and the older grant racing it, and one to spare
		t.Cleanup(func() { _ = db.Close() })
		r.proxies, r.dbs = append(r.proxies, p), append(r.dbs, db)
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
	t.Logf("pgsql: transactions judged by isolation level: %s %d, %s %d, %s %d",
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
	name := "pgsql"
	if variant != pgSound {
		name = fmt.Sprintf("pgsql-control%d", variant)
	}
	res.verdict, err = Check(PgModel.ToModel(), res.ops, 3*time.Minute, name, b.Seed)
	if err != nil {
		t.Error(err)
	}
	t.Logf("pgsql: %d leases, %d pauses past a lease, %d stale refusals, %d version conflicts, %d aborted, %d latency changes",
		r.leases.Load(), r.pauses.Load(), r.stale.Load(), r.conflict.Load(), r.aborted.Load(), r.latency.Load())
	t.Logf("pgsql: errors that left calls open: %v", r.errs)
	checkUnmarked(t, "pgsql", r.unmarked.Load())
	return res
}

// killer terminates one of the workers' backends every 100 to 500 ms.
func (r *sqlRun) killer(ctx context.Context, app string, rng *rand.Rand) {
	for {
		t := time.NewTimer(time.Duration(100+rng.IntN(400)) * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		var killed bool
		err := r.admin.QueryRowContext(ctx, `SELECT coalesce(bool_or(pg_terminate_backend(pid)), false) FROM
			(SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid() ORDER BY random() LIMIT 1) AS victim`, app).Scan(&killed)
		if err == nil && killed {
			r.kills.Add(1)
		}
	}
}

func (r *sqlRun) worker(ctx context.Context, w int) {
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
		if rng.IntN(4) != 0 {
			if out := r.read(cctx, w, key); out.Status == Ok {
				lastVersion[key] = out.Version
			}
		}
		if rng.IntN(3) != 0 && !r.rrShape() {
			in := PgIn{Key: key, Op: PgUV, Expected: lastVersion[key], Data: data()}
			c := r.invoke(w, in)
			v, err := sqlTable.UpdateVersion(cctx, r.dbs[w], key, in.Expected, pgsql.Set("val", in.Data))
			out := r.outcome(in, err)
			if out.Status == Ok {
				out.Version = v
			}
			r.finish(c, out)
		}
		cancel()
	}
}

func (r *sqlRun) session(ctx context.Context, w int, rng *rand.Rand, key string, data func() string) {
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
		case n < 30:
			out = r.txRMW(cctx, w, key, f, data(), "")
		case n < 40:
			out = r.txRead(cctx, w, key, f)
		case r.rrShape() && n < 66:
			out = r.txRMW(cctx, w, key, f, data(), "") // no unfenced writer in this shape
		case n < 58:
			out, row = r.rowUpdate(cctx, w, key, f, data(), ""), true
		case n < 66:
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

// rowUpdate is Table.Update: with d, a write of the value under the row's
// own mark; without, a raise of the mark alone.
func (r *sqlRun) rowUpdate(ctx context.Context, w int, key string, f fence.Fence, d, attack string) PgOut {
	in := PgIn{Key: key, Op: PgRowUpd, Fence: markOf(f), Data: d, Attack: attack}
	var values []pgsql.Assignment
	if d == "" {
		in.Op = PgRowMark
	} else {
		values = append(values, pgsql.Set("val", d))
	}
	c := r.invoke(w, in)
	err := sqlTable.Update(ctx, r.dbs[w], f, key, values...)
	return r.finish(c, r.outcome(in, err))
}

// attack offers, right after f was admitted on key, a fence that no lock
// issued (forge): a sound guard refuses each. One that is admitted counts
// as gone wrong.
func (r *sqlRun) attack(w int, rng *rand.Rand, key string, f fence.Fence, row bool, d string) {
	forged, kind := forge(w, rng, &r.holders, key, f)
	ctx, cancel := context.WithTimeout(context.Background(), pgCallLimit)
	defer cancel()
	var out PgOut
	if row {
		out = r.rowUpdate(ctx, w, key, forged, d, kind)
	} else {
		out = r.txRMW(ctx, w, key, forged, d, kind)
	}
	if out.Status == Ok {
		r.exposed.Add(1)
	}
}

// once runs Once as the pgx checker's once does (onceCall): work that
// writes the row, with COMMIT's reply lost or its context ended in some
// first tries, and a call whose outcome is unknown retried.
func (r *sqlRun) once(w int, rng *rand.Rand, key string, f fence.Fence, d string) PgOut {
	idx, okey := onceKey(rng, &r.onceLast, r.oncePrefix, key)
	in := PgIn{Key: key, Op: PgOnce, Fence: markOf(f), Once: idx, Data: d}
	return onceCall(r, w, rng, r.proxies[w], in, &r.resolved, func(ctx context.Context, late func()) (bool, error) {
		work := func(ctx context.Context, tx *sql.Tx) error {
			var was string
			if err := tx.QueryRowContext(ctx, pgLockedReadSQL, key).Scan(&was, new(int64)); err != nil {
				return err
			}
			if was == d {
				r.exposed.Add(1) // an earlier try ran the work already
			}
			_, err := tx.ExecContext(ctx, pgWriteSQL, key, d)
			late()
			return err
		}
		if r.variant == pgOnceAfter {
			return pgsqlOnceAfter(ctx, r.dbs[w], f, okey, work, &r.exposed)
		}
		return pgsql.Once(ctx, r.dbs[w], f, okey, work)
	})
}

func (r *sqlRun) read(ctx context.Context, w int, key string) PgOut {
	in := PgIn{Key: key, Op: PgRead}
	c := r.invoke(w, in)
	var out PgOut
	var rtok, gtok sql.NullInt64
	var rhold, ghold sql.NullString
	err := r.dbs[w].QueryRowContext(ctx, pgReadSQL, key, "r-"+key).Scan(&out.Data, &out.Version, &rtok, &rhold, &gtok, &ghold)
	res := r.outcome(in, err)
	if res.Status != Ok {
		return r.finish(c, res)
	}
	out.Status = Ok
	out.Row = Mark{Token: rtok.Int64, Holder: rhold.String}
	out.Guard = Mark{Token: gtok.Int64, Holder: ghold.String}
	return r.finish(c, out)
}

func (r *sqlRun) txRMW(ctx context.Context, w int, key string, f fence.Fence, d, attack string) PgOut {
	in := PgIn{Key: key, Op: PgTxRMW, Fence: markOf(f), Data: d, Attack: attack}
	c := r.invoke(w, in)
	var old PgOut
	var err error
	if r.variant == pgReadOutside {
		err = r.dbs[w].QueryRowContext(ctx, pgLockedReadSQL, key).Scan(&old.Data, &old.Version)
		time.Sleep(time.Duration(rand.IntN(10_000)) * time.Microsecond)
		var changed bool
		if err == nil {
			err = pgsql.InTx(ctx, r.dbs[w], nil, f, func(ctx context.Context, tx *sql.Tx) error {
				var now int64
				if err := tx.QueryRowContext(ctx, `SELECT version FROM kv WHERE key = $1 FOR UPDATE`, key).Scan(&now); err != nil {
					return err
				}
				changed = now != old.Version
				_, err := tx.ExecContext(ctx, pgWriteSQL, key, d)
				return err
			})
		}
		if err == nil && changed {
			r.exposed.Add(1)
		}
	} else {
		level := r.level()
		if !r.rrShape() && r.ownTx() {
			err = r.ownTxRMW(ctx, w, level, f, key, d, &old)
		} else {
			err = pgsql.InTx(ctx, r.dbs[w], &sql.TxOptions{Isolation: sqlLevels[level]}, f, func(ctx context.Context, tx *sql.Tx) error {
				if err := tx.QueryRowContext(ctx, pgLockedReadSQL, key).Scan(&old.Data, &old.Version); err != nil {
					return err
				}
				_, err := tx.ExecContext(ctx, pgWriteSQL, key, d)
				return err
			})
		}
		r.judgedAt(level, err)
	}
	out := r.outcome(in, err)
	if out.Status == Ok {
		out.Data, out.Version = old.Data, old.Version
	}
	return r.finish(c, out)
}

func (r *sqlRun) txRead(ctx context.Context, w int, key string, f fence.Fence) PgOut {
	in := PgIn{Key: key, Op: PgTxRead, Fence: markOf(f)}
	c := r.invoke(w, in)
	var got PgOut
	level := r.level()
	read := pgTxSharedReadSQL // a plain read above READ COMMITTED, as pgRun's txRead
	if r.rrShape() {
		read = pgPlainReadSQL
	}
	err := pgsql.InTx(ctx, r.dbs[w], &sql.TxOptions{Isolation: sqlLevels[level]}, f, func(ctx context.Context, tx *sql.Tx) error {
		var superseded bool
		err := tx.QueryRowContext(ctx, read, key).Scan(&got.Data, &got.Version, &superseded)
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

func (r *sqlRun) invoke(w int, in PgIn) pgCall {
	return pgCall{c: r.rec.Invoke(w, in), key: in.Key}
}

// outcome classifies err as the pgx checker's does, with this package's
// errors.
func (r *sqlRun) outcome(in PgIn, err error) PgOut {
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
	case errors.Is(err, pgsql.ErrRetryable), errors.Is(err, errRolledBack):
		out.Status = Aborted
		r.aborted.Add(1)
	case errors.Is(err, fence.ErrNotFound), errors.Is(err, fence.ErrInvalid), errors.Is(err, pgsql.ErrNotMigrated):
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

func (r *sqlRun) finish(c pgCall, out PgOut) PgOut {
	if out.Status == Unknown {
		c.c.Open(out)
		r.keys.opened(c.key)
		return out
	}
	c.c.Return(out)
	return out
}
