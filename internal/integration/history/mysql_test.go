package history

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	gomysql "github.com/go-sql-driver/mysql"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
	"github.com/fencekit/fencekit/migrations"
	"github.com/fencekit/fencekit/storage/mysql"
)

// myVariant selects what the MySQL workers run: the guard as it is, or a
// deliberately broken variant that the checker must reject.
type myVariant int

const (
	// mySound is the guard as shipped.
	mySound myVariant = iota
	// myTokenGE admits by token >= instead of >, in the guard and the
	// row-level admission.
	myTokenGE
	// myNoHolder admits a fence with the mark's token whatever its holder,
	// in the same two places.
	myNoHolder
	// myNoRowLock guards a transaction by reading the mark without a lock,
	// deciding in the client, then writing the mark (see myBreakingConn).
	myNoRowLock
	// myOnceAfter runs Once's work first and records its completion after,
	// in a transaction of its own (myOnceAfterRun).
	myOnceAfter
	// mySnapshot judges InTx's and Once's fence from a plain read of the
	// mark, the transaction's snapshot, instead of the row its UPDATE locks
	// (mySnapshotStmt): a holder whose mark a newer holder raised while it
	// waited is admitted.
	mySnapshot
	// myOnceNoIgnore writes Once's record with INSERT instead of INSERT
	// IGNORE: a Once on a done key then fails with a duplicate key instead
	// of reporting the work done.
	myOnceNoIgnore
)

// myBreaks is the statement changes of each SQL-changing variant. They keep
// every placeholder, so that the arguments still line up. The guard's
// fragments are shared by its three statements (guardSQL, admitSQL and
// followSQL), so each break changes all three.
var myBreaks = map[myVariant][]sqlBreak{
	myTokenGE: {
		{"? > token OR", "? >= token OR"},
		{"`fence_token` < ? OR", "`fence_token` <= ? OR"},
	},
	myNoHolder: {
		{"(? = token AND ? = holder)", "(? = token AND (? = holder OR TRUE))"},
		{"`fence_holder` = ?))", "(`fence_holder` = ? OR TRUE)))"},
	},
	myOnceNoIgnore: {
		{"INSERT IGNORE INTO fencekit_once", "INSERT INTO fencekit_once"},
	},
}

// erDupEntry is MySQL's error for a duplicate key.
const erDupEntry = 1062

// serverRefused reports whether err holds the server's error reply to a
// statement, other than those of a connection or statement that the
// workload's faults killed (ER_QUERY_INTERRUPTED, ER_SERVER_SHUTDOWN,
// ER_CONNECTION_KILLED): a definite answer, not a fault.
func serverRefused(err error) bool {
	var my *gomysql.MySQLError
	if !errors.As(err, &my) {
		return false
	}
	switch my.Number {
	case 1317, 1053, 1927:
		return false
	}
	return true
}

const (
	myWorkers   = 6
	myKeySlots  = 2
	myKeyOps    = 150
	myKeyOpen   = 10
	myRows      = 3000
	myCallLimit = time.Second
	myHold      = 300 * time.Millisecond

	myReadSQL = "SELECT k.val, k.version, k.fence_token, k.fence_holder, g.token, g.holder\n" +
		"FROM kv k LEFT JOIN fencekit_guard g ON g.resource = ? WHERE k.`key` = ?"
	myLockedReadSQL = "SELECT val, version FROM kv WHERE `key` = ? FOR UPDATE"
	mySharedReadSQL = "SELECT val, version FROM kv WHERE `key` = ? LOCK IN SHARE MODE"
	myWriteSQL      = "UPDATE kv SET val = ?, version = version + 1 WHERE `key` = ?"
)

var myTable = mysql.Table{Name: "kv", Key: "key"}

type myRun struct {
	t        testing.TB
	b        Budget
	variant  myVariant
	rec      *Recorder
	locker   *lock.Locker
	keys     *keyRing
	holders  sync.Map // key -> the holder of the latest grant a worker took on it
	fences   sync.Map // key -> the fence of the latest grant a worker took on it
	onceLast sync.Map // key -> the key of work (1 to PgOnceKeys) of the latest Once on it
	dbName   string

	proxies []*testenv.Proxy
	dbs     []*sql.DB
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
	swapped  atomic.Int64
	follows  atomic.Int64
	resolved atomic.Int64

	levelMu      sync.Mutex
	levelRng     *rand.Rand               // draws each transaction's isolation level
	atLevel      map[string]*atomic.Int64 // txrmw and txread calls answered at each level
	sessionLevel sql.IsolationLevel       // the workers' sessions' default (tx_isolation)

	mu   sync.Mutex
	errs map[string]int
}

// myLevels are the isolation levels a transaction of the MySQL workload
// runs at, one drawn for each; LevelDefault is the session's default,
// which some runs change (myRun.sessionLevel, set on the workers'
// connections only: the server's global setting is not the test's).
var myLevels = []sql.IsolationLevel{sql.LevelDefault, sql.LevelReadCommitted, sql.LevelRepeatableRead, sql.LevelSerializable}

// level draws the isolation level of a transaction, and the level it runs
// at.
func (r *myRun) level() (opts *sql.TxOptions, at sql.IsolationLevel) {
	if r.variant != mySound {
		// The controls keep the transactions they were tuned on.
		return nil, r.sessionLevel
	}
	r.levelMu.Lock()
	l := myLevels[r.levelRng.IntN(len(myLevels))]
	r.levelMu.Unlock()
	if l == sql.LevelDefault {
		return nil, r.sessionLevel
	}
	return &sql.TxOptions{Isolation: l}, l
}

// judgedAt counts a transaction at level whose answer the checker judges:
// admitted, refused, or rolled back (a deadlock or serialization failure
// counts as a refusal, never as a lost write).
func (r *myRun) judgedAt(level sql.IsolationLevel, err error) {
	var stale *fence.StaleError
	if err == nil || errors.As(err, &stale) || errors.Is(err, mysql.ErrRetryable) {
		r.atLevel[level.String()].Add(1)
	}
}

type myResult struct {
	ops     []porcupine.Operation
	calls   int
	open    int
	keys    int
	faults  testenv.ProxyFaults
	kills   int64
	exposed int64
	took    time.Duration
	verdict Verdict
	judged  Judgments
}

// myRates is the least a run of the MySQL checker must judge of each kind
// (see PgKinds) per second: a third or less of what a two-core machine
// makes under a load of 40.
var myRates = Rates{
	"tx at Read Committed": 0.05, "tx at Repeatable Read": 0.05, "tx at Serializable": 0.05,
	PgRead: 0.5, PgTxRMW: 0.5, PgTxRead: 0.1, PgRowUpd: 0.3, PgRowMark: 0.1, PgUV: 0.5, PgOnce: 0.5,
	"stale refused": 0.2, "conflict": 0.1, "open placed": 0.2, "once ran": 0.05, "once done already": 0.05, "once unknown resolved": 0.05,
	"attack " + AttackOtherHolder: 0.05, "attack " + AttackOlderToken: 0.05, "attack " + AttackStolen: 0.05, "attack " + AttackRacing: 0.1,
}

// TestMySQLLinearizable runs the MySQL guard (storage/mysql: InTx, Table,
// Once) under faults and checks its history against the SQL guard model.
func TestMySQLLinearizable(t *testing.T) {
	t.Parallel()
	b := BudgetFor(t)
	res := runMySQL(t, b, mySound)
	reportMySQL(t, res)
	res.judged.Require(t, "mysql", myRates.For(b.Duration))
	if res.faults.Lost+res.faults.Held+res.faults.Cut+int(res.kills) == 0 {
		t.Fatalf("no fault was injected in %v (seed %d): the run proves nothing", b.Duration, b.Seed)
	}
	switch res.verdict.Result {
	case porcupine.Illegal:
		t.Fatalf("MySQL guard history is not linearizable (seed %d, replay with FENCEKIT_CHECK_SEED=%d); history: %s, rejected rows: %s",
			b.Seed, b.Seed, res.verdict.File, res.verdict.Text)
	case porcupine.Unknown:
		t.Fatalf("the checker ran out of time on the history (seed %d)", b.Seed)
	}
}

func reportMySQL(t testing.TB, res myResult) {
	t.Helper()
	t.Logf("mysql: %d calls on %d rows in %v (%d left open), faults injected: %d connections killed, %d replies lost, %d held for %v, %d connections cut; checked in %v: %s",
		res.calls, res.keys, res.took.Round(time.Millisecond), res.open, res.kills, res.faults.Lost, res.faults.Held, myHold, res.faults.Cut, res.verdict.Took.Round(time.Millisecond), res.verdict.Result)
}

func runMySQL(t testing.TB, b Budget, variant myVariant) myResult {
	t.Helper()
	ctx := context.Background()
	cfg := testenv.MySQLConfig(t)
	admin := testenv.OpenMySQL(t, cfg.Clone())
	if err := migrations.UpMySQL(ctx, admin); err != nil {
		t.Fatalf("migrations: %v", err)
	}
	if _, err := admin.ExecContext(ctx, "CREATE TABLE kv (`key` VARCHAR(64) NOT NULL PRIMARY KEY, val VARCHAR(255) NOT NULL DEFAULT '', "+
		"version BIGINT NOT NULL DEFAULT 0, fence_token BIGINT NULL, fence_holder VARBINARY(1024) NULL) ENGINE = InnoDB"); err != nil {
		t.Fatalf("create kv: %v", err)
	}
	for i := 0; i < myRows; i += 500 {
		var sb strings.Builder
		sb.WriteString("INSERT INTO kv (`key`) VALUES ")
		for j := i + 1; j <= i+500; j++ {
			if j > i+1 {
				sb.WriteString(", ")
			}
			fmt.Fprintf(&sb, "('k%d')", j)
		}
		if _, err := admin.ExecContext(ctx, sb.String()); err != nil {
			t.Fatalf("fill kv: %v", err)
		}
	}
	prefix := testenv.Prefix(t)
	locker, err := lock.New(testenv.Redis(t), lock.WithPrefix(prefix+"l:"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(locker.Close)

	r := &myRun{t: t, b: b, variant: variant, rec: NewRecorder(), locker: locker, admin: admin, dbName: cfg.DBName,
		keys: newKeyRing(myKeySlots, myKeyOps, myKeyOpen), errs: map[string]int{},
		levelRng: rand.New(rand.NewPCG(b.Seed, 1<<34)), atLevel: map[string]*atomic.Int64{}}
	for _, l := range myLevels[1:] {
		r.atLevel[l.String()] = new(atomic.Int64)
	}
	// The sessions' default: InnoDB's (REPEATABLE READ) in a third of the
	// sound runs, changed to READ COMMITTED or SERIALIZABLE in the others.
	sessionDefaults := []struct {
		level sql.IsolationLevel
		value string
	}{{sql.LevelRepeatableRead, ""}, {sql.LevelReadCommitted, "'READ-COMMITTED'"}, {sql.LevelSerializable, "'SERIALIZABLE'"}}
	sd := sessionDefaults[b.Seed%3]
	if variant != mySound {
		sd = sessionDefaults[0] // the controls keep the sessions they were tuned on
	}
	r.sessionLevel = sd.level
	t.Logf("mysql: the workers' sessions default to %s", sd.level)
	for range myWorkers {
		wcfg := cfg.Clone()
		if sd.value != "" {
			if wcfg.Params == nil {
				wcfg.Params = map[string]string{}
			}
			wcfg.Params["tx_isolation"] = sd.value
		}
		p := testenv.StartProxy(t, cfg.Addr)
		wcfg.Addr = p.Addr()
		wcfg.Timeout = 2 * time.Second
		wcfg.Logger = gomysql.Logger(log.New(io.Discard, "", 0)) // the faults break connections by design
		conn, err := gomysql.NewConnector(wcfg)
		if err != nil {
			t.Fatal(err)
		}
		// Without a break or a flag (the sound run, myOnceAfter) it only
		// counts the guards by followSQL.
		conn = breakingConnector{Connector: conn, breaks: myBreaks[variant], unlocked: variant == myNoRowLock, judgeUnlocked: variant == mySnapshot,
			swapped: &r.swapped, exposed: &r.exposed, follows: &r.follows}
		db := sql.OpenDB(conn)
		db.SetMaxOpenConns(2)
		t.Cleanup(func() { _ = db.Close() })
		r.proxies, r.dbs = append(r.proxies, p), append(r.dbs, db)
	}

	var exposed *atomic.Int64
	if variant != mySound {
		exposed = &r.exposed
	}
	start := time.Now()
	rctx, cancel := runContext(b, exposed)
	defer cancel()
	var wg sync.WaitGroup
	for w := range myWorkers {
		wg.Go(func() { r.worker(rctx, w) })
	}
	wg.Go(func() { r.killer(rctx, rand.New(rand.NewPCG(b.Seed, 1<<33))) })
	nemesis(rctx, r.proxies, rand.New(rand.NewPCG(b.Seed, 1<<32)), 150*time.Millisecond, myHold, &r.latency)
	wg.Wait()
	took := time.Since(start)

	res := myResult{ops: r.rec.Operations(), kills: r.kills.Load(), keys: r.keys.used(), exposed: r.exposed.Load(), took: took}
	res.calls, res.open = r.rec.Counts()
	for _, p := range r.proxies {
		f := p.Faults()
		res.faults.Lost += f.Lost
		res.faults.Held += f.Held
		res.faults.Cut += f.Cut
	}
	res.judged = Tally(res.ops, PgKinds)
	res.judged["once unknown resolved"] = r.resolved.Load()
	for _, l := range myLevels[1:] {
		res.judged["tx at "+l.String()] = r.atLevel[l.String()].Load()
	}
	t.Logf("mysql: transactions judged by isolation level: %s %d, %s %d, %s %d", myLevels[1], r.atLevel[myLevels[1].String()].Load(),
		myLevels[2], r.atLevel[myLevels[2].String()].Load(), myLevels[3], r.atLevel[myLevels[3].String()].Load())
	if _, ok := myBreaks[variant]; ok || variant == myNoRowLock || variant == mySnapshot {
		brokenRan(t, r.swapped.Load(), res.judged[PgTxRMW]+res.judged[PgTxRead]+res.judged[PgOnce])
	}
	followsRan(t, r.follows.Load(), res.judged[PgTxRMW]+res.judged[PgTxRead]+res.judged[PgOnce])
	name := "mysql"
	if variant != mySound {
		name = fmt.Sprintf("mysql-control%d", variant)
	}
	res.verdict, err = Check(PgModel.ToModel(), res.ops, 3*time.Minute, name, b.Seed)
	if err != nil {
		t.Error(err)
	}
	t.Logf("mysql: %d leases, %d pauses past a lease, %d stale refusals, %d version conflicts, %d aborted, %d latency changes",
		r.leases.Load(), r.pauses.Load(), r.stale.Load(), r.conflict.Load(), r.aborted.Load(), r.latency.Load())
	t.Logf("mysql: errors that left calls open: %v", r.errs)
	checkUnmarked(t, "mysql", r.unmarked.Load())
	return res
}

// followsRan fails a run whose guarded calls never sent followSQL, the
// guard of a lease's following writes: the workload would then check only
// the first write of each lease.
func followsRan(t testing.TB, follows, guarded int64) {
	t.Helper()
	t.Logf("mysql: %d guards by a locking read of a lease's following write; %d guarded calls were answered", follows, guarded)
	if follows == 0 && guarded >= 20 {
		t.Fatal("no guard of a lease's following write ran: the workload no longer exercises it")
	}
}

// killer kills one of the workers' connections every 100 to 500 ms.
func (r *myRun) killer(ctx context.Context, rng *rand.Rand) {
	for {
		t := time.NewTimer(time.Duration(100+rng.IntN(400)) * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		var id int64
		err := r.admin.QueryRowContext(ctx, "SELECT id FROM information_schema.processlist WHERE db = ? AND id <> CONNECTION_ID() AND command <> 'Killed' ORDER BY RAND() LIMIT 1", r.dbName).Scan(&id)
		if err != nil {
			continue
		}
		if _, err := r.admin.ExecContext(ctx, fmt.Sprintf("KILL CONNECTION %d", id)); err == nil {
			r.kills.Add(1)
		}
	}
}

func (r *myRun) worker(ctx context.Context, w int) {
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
		cctx, cancel := context.WithTimeout(context.Background(), myCallLimit)
		if rng.IntN(4) != 0 {
			if out := r.read(cctx, w, key); out.Status == Ok {
				lastVersion[key] = out.Version
			}
		}
		if rng.IntN(3) != 0 {
			in := PgIn{Key: key, Op: PgUV, Expected: lastVersion[key], Data: data()}
			c := r.invoke(w, in)
			v, err := myTable.UpdateVersion(cctx, r.dbs[w], key, in.Expected, mysql.Set("val", in.Data))
			out := r.outcome(in, err)
			if out.Status == Ok {
				out.Version = v
			}
			r.finish(c, out)
		}
		cancel()
	}
}

func (r *myRun) session(ctx context.Context, w int, rng *rand.Rand, key string, data func() string) {
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
	prev, _ := r.fences.Swap(key, f)
	r.holders.Store(key, f.Holder)
	// As in the PostgreSQL checker: half the sessions start racing the
	// previous grant's holder.
	var race sync.WaitGroup
	defer race.Wait()
	if p, ok := prev.(fence.Fence); ok && rng.IntN(2) == 0 {
		d := data()
		all := rng.IntN(2) == 0
		race.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), myCallLimit)
			defer cancel()
			if all {
				r.guardAllRMW(ctx, w, key, p, d)
				return
			}
			r.txRMW(ctx, w, key, p, d, AttackRacing)
		})
	}
	for range 1 + rng.IntN(4) {
		if rng.IntN(5) == 0 {
			r.pauses.Add(1)
			time.Sleep(ttl + time.Duration(rng.IntN(30))*time.Millisecond)
		}
		cctx, cancel := context.WithTimeout(context.Background(), myCallLimit)
		var out PgOut
		row := false
		switch n := rng.IntN(100); {
		case n < 30:
			out = r.txRMW(cctx, w, key, f, data(), "")
		case n < 40:
			out = r.txRead(cctx, w, key, f)
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
		if out.Status == Ok && rng.IntN(3) == 0 {
			r.attack(w, rng, key, f, row, data())
		}
	}
}

func (r *myRun) read(ctx context.Context, w int, key string) PgOut {
	in := PgIn{Key: key, Op: PgRead}
	c := r.invoke(w, in)
	var out PgOut
	var rtok, gtok sql.NullInt64
	var rhold, ghold sql.NullString
	err := r.dbs[w].QueryRowContext(ctx, myReadSQL, "r-"+key, key).Scan(&out.Data, &out.Version, &rtok, &rhold, &gtok, &ghold)
	res := r.outcome(in, err)
	if res.Status != Ok {
		return r.finish(c, res)
	}
	out.Status = Ok
	out.Row, out.Guard = Mark{Token: rtok.Int64, Holder: rhold.String}, Mark{Token: gtok.Int64, Holder: ghold.String}
	return r.finish(c, out)
}

func (r *myRun) txRMW(ctx context.Context, w int, key string, f fence.Fence, d, attack string) PgOut {
	in := PgIn{Key: key, Op: PgTxRMW, Fence: markOf(f), Data: d, Attack: attack}
	c := r.invoke(w, in)
	var old PgOut
	opts, level := r.level()
	err := mysql.InTx(ctx, r.dbs[w], opts, f, func(ctx context.Context, tx *sql.Tx) error {
		if err := tx.QueryRowContext(ctx, myLockedReadSQL, key).Scan(&old.Data, &old.Version); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, myWriteSQL, d, key)
		return err
	})
	r.judgedAt(level, err)
	out := r.outcome(in, err)
	if out.Status == Ok {
		out.Data, out.Version = old.Data, old.Version
	}
	return r.finish(c, out)
}

// guardAllRMW is txRMW guarded by GuardAll over two resources: a new one
// (its guard row is inserted, and the mark read back, which takes the
// transaction's snapshot), then the row's. The row's mark must then be
// read as it is, not as the snapshot saw it, or an older fence whose mark
// was replaced since the snapshot is admitted. The model sees the row's
// resource only: the new one admits any fence.
func (r *myRun) guardAllRMW(ctx context.Context, w int, key string, f fence.Fence, d string) PgOut {
	in := PgIn{Key: key, Op: PgTxRMW, Fence: markOf(f), Data: d, Attack: AttackRacing}
	c := r.invoke(w, in)
	first := f
	first.Resource = fmt.Sprintf("a-%s-%d", key, rand.Uint64())
	return r.ownTxRMW(ctx, w, c, in, key, d, func(tx *sql.Tx) error { return mysql.GuardAll(ctx, tx, first, f) })
}

func (r *myRun) txRead(ctx context.Context, w int, key string, f fence.Fence) PgOut {
	in := PgIn{Key: key, Op: PgTxRead, Fence: markOf(f)}
	c := r.invoke(w, in)
	var got PgOut
	opts, level := r.level()
	err := mysql.InTx(ctx, r.dbs[w], opts, f, func(ctx context.Context, tx *sql.Tx) error {
		return tx.QueryRowContext(ctx, mySharedReadSQL, key).Scan(&got.Data, &got.Version)
	})
	r.judgedAt(level, err)
	out := r.outcome(in, err)
	if out.Status == Ok {
		out.Data, out.Version = got.Data, got.Version
	}
	return r.finish(c, out)
}

// rowUpdate is Table.Update: with d, a write of the value under the row's
// own mark; without, a raise of the mark alone. It runs in a transaction,
// so that the read that tells a refusal from a write changing nothing is
// exact.
func (r *myRun) rowUpdate(ctx context.Context, w int, key string, f fence.Fence, d, attack string) PgOut {
	in := PgIn{Key: key, Op: PgRowUpd, Fence: markOf(f), Data: d, Attack: attack}
	var values []mysql.Assignment
	if d == "" {
		in.Op = PgRowMark
	} else {
		values = append(values, mysql.Set("val", d))
	}
	c := r.invoke(w, in)
	err := myTable.Update(ctx, r.dbs[w], f, key, values...)
	return r.finish(c, r.outcome(in, err))
}

// attack offers, right after f was admitted on key, a fence that no lock
// issued, as the PostgreSQL checker's attack does.
func (r *myRun) attack(w int, rng *rand.Rand, key string, f fence.Fence, row bool, d string) {
	forged := f
	var kind string
	switch rng.IntN(3) {
	case 0:
		kind, forged.Holder = AttackOtherHolder, fmt.Sprintf("forged-w%d-%d", w, rng.Uint32())
	case 1:
		kind, forged.Token = AttackOlderToken, f.Token-1-fence.Token(rng.IntN(3))
	default:
		kind = AttackStolen
		if h, ok := r.holders.Load(key); ok && h.(string) != f.Holder {
			forged.Holder = h.(string)
		} else {
			forged.Holder = fmt.Sprintf("other-w%d-%d", w, rng.Uint32())
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), myCallLimit)
	defer cancel()
	var out PgOut
	switch {
	case row:
		out = r.rowUpdate(ctx, w, key, forged, d, kind)
	case rng.IntN(2) == 0:
		out = r.guardRMW(ctx, w, key, forged, d, kind)
	default:
		out = r.txRMW(ctx, w, key, forged, d, kind)
	}
	if out.Status == Ok {
		r.exposed.Add(1)
	}
}

// guardRMW is txRMW in a transaction of the caller's own, guarded by
// mysql.Guard: its INSERT ... ON DUPLICATE KEY UPDATE judges the fence on
// the existing row (guardSQL), a statement InTx never sends, so that the
// attacks meet it too.
func (r *myRun) guardRMW(ctx context.Context, w int, key string, f fence.Fence, d, attack string) PgOut {
	in := PgIn{Key: key, Op: PgTxRMW, Fence: markOf(f), Data: d, Attack: attack}
	c := r.invoke(w, in)
	return r.ownTxRMW(ctx, w, c, in, key, d, func(tx *sql.Tx) error { return mysql.Guard(ctx, tx, f) })
}

// ownTxRMW runs txRMW's read and write in a transaction of the caller's
// own whose first statement is guard, and finishes call c with the
// outcome: a failed commit's is unknown.
func (r *myRun) ownTxRMW(ctx context.Context, w int, c myCall, in PgIn, key, d string, guard func(tx *sql.Tx) error) PgOut {
	var old PgOut
	tx, err := r.dbs[w].BeginTx(ctx, nil)
	if err == nil {
		err = guard(tx)
		if err == nil {
			err = tx.QueryRowContext(ctx, myLockedReadSQL, key).Scan(&old.Data, &old.Version)
		}
		if err == nil {
			_, err = tx.ExecContext(ctx, myWriteSQL, d, key)
		}
		if err == nil {
			err = tx.Commit()
			if err != nil {
				err = fmt.Errorf("%w: commit: %w", fence.ErrOutcomeUnknown, err)
			}
		} else {
			_ = tx.Rollback()
		}
	}
	out := r.outcome(in, err)
	if out.Status == Ok {
		out.Data, out.Version = old.Data, old.Version
	}
	return r.finish(c, out)
}

// once runs Once, as the PostgreSQL checker's once does: half the first
// tries lose COMMIT's reply or end their context while it is in flight;
// a call whose outcome is unknown is retried with the same fence and work.
func (r *myRun) once(w int, rng *rand.Rand, key string, f fence.Fence, d string) PgOut {
	// Half the calls run a key of work that ran last on this row again:
	// its record must make it change nothing (the run finds it done).
	idx := 1 + rng.IntN(PgOnceKeys)
	if last, ok := r.onceLast.Load(key); ok && rng.IntN(2) == 0 {
		idx = last.(int)
	}
	r.onceLast.Store(key, idx)
	okey := fmt.Sprintf("%s/%d", key, idx)
	var out PgOut
	for try := range 4 {
		// Each try has a call's time of its own: a retry after a lost
		// reply starts on a new connection.
		cctx, cancel := context.WithTimeout(context.Background(), myCallLimit)
		late := -1
		if try == 0 {
			late = rng.IntN(8)
		}
		in := PgIn{Key: key, Op: PgOnce, Fence: markOf(f), Once: idx, Data: d}
		c := r.invoke(w, in)
		work := func(ctx context.Context, tx *sql.Tx) error {
			var was string
			var ver int64
			if err := tx.QueryRowContext(ctx, myLockedReadSQL, key).Scan(&was, &ver); err != nil {
				return err
			}
			if was == d {
				r.exposed.Add(1) // an earlier try ran the work already
			}
			_, err := tx.ExecContext(ctx, myWriteSQL, d, key)
			switch late {
			case 0:
				time.AfterFunc(time.Duration(rng.IntN(2000))*time.Microsecond, cancel)
			case 1, 2, 3, 4:
				r.proxies[w].LoseNextReply(nil)
			}
			return err
		}
		var ran bool
		var err error
		if r.variant == myOnceAfter {
			ran, err = myOnceAfterRun(cctx, r.dbs[w], f, okey, work, &r.exposed)
		} else {
			ran, err = mysql.Once(cctx, r.dbs[w], f, okey, work)
		}
		if my := (*gomysql.MySQLError)(nil); errors.As(err, &my) && my.Number == erDupEntry {
			r.exposed.Add(1) // the record's insert met the done key's record
		}
		cancel()
		out = r.outcome(in, err)
		if out.Status == Ok {
			out.Ran = ran
		}
		r.finish(c, out)
		if out.Status != Unknown {
			if try > 0 {
				r.resolved.Add(1)
			}
			return out
		}
	}
	return out
}

type myCall struct {
	c   Call
	key string
}

func (r *myRun) invoke(w int, in PgIn) myCall {
	return myCall{c: r.rec.Invoke(w, in), key: in.Key}
}

// outcome classifies err as the PostgreSQL checker's does.
func (r *myRun) outcome(in PgIn, err error) PgOut {
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
	case errors.Is(err, mysql.ErrRetryable):
		out.Status = Aborted
		r.aborted.Add(1)
	case in.Op == PgOnce && serverRefused(err):
		// The server answered: the call is over, and the model judges
		// whether failing was allowed.
		out.Status = Failed
	case errors.Is(err, fence.ErrNotFound), errors.Is(err, fence.ErrInvalid), errors.Is(err, mysql.ErrNotMigrated):
		r.t.Errorf("%s on %s: %v", in.Op, in.Key, err)
		out.Status = Unknown
	default:
		out.Status = Unknown
		if in.Op != PgRead && !errors.Is(err, fence.ErrOutcomeUnknown) {
			r.unmarked.Add(1)
			if takeAtWord {
				out.Status = Aborted
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

func (r *myRun) finish(c myCall, out PgOut) PgOut {
	if out.Status == Unknown {
		c.c.Open(out)
		r.keys.opened(c.key)
		return out
	}
	c.c.Return(out)
	return out
}
