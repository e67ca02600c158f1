package pglock

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/lockmodel"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
	"github.com/fencekit/fencekit/migrations"
)

// The lock model (internal/harness/lockmodel) on PostgreSQL: a run on the
// shared server in a database of its own, a run under faults on a private
// server, and the negative controls, broken variants of the migration's
// functions installed with CREATE OR REPLACE FUNCTION in a database of
// the test's own, which the model must reject.

// modelObserveSQL reads a resource in one statement, on the server's
// clock: the holder of a lease not ended and its token, the queue in
// order with how long each entry stays live unrefreshed, the clock in µs,
// below every token granted after the reply, and how long the lease has
// left in µs (rounded up).
const modelObserveSQL = `
WITH l AS (
    SELECT holder, token, ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000000)::bigint AS left_us
    FROM fencekit_lock WHERE resource = $1 AND expires_at > clock_timestamp()
), w AS (
    SELECT id, waiter,
        floor(extract(epoch FROM refreshed + life_ms * interval '1 millisecond' - clock_timestamp()) * 1000)::bigint AS life
    FROM fencekit_lock_waiter WHERE resource = $1
)
SELECT coalesce((SELECT holder FROM l), ''), coalesce((SELECT token FROM l), 0),
    coalesce((SELECT array_agg(waiter ORDER BY id) FROM w), '{}'),
    coalesce((SELECT array_agg(life ORDER BY id) FROM w), '{}'),
    fencekit_lock_us(clock_timestamp()), coalesce((SELECT left_us FROM l), 0)`

// modelGrantLogSQL keeps a log of every grant the server makes (a holder
// or a token set on a lock row), for the queue check: a waiter can be
// handed the lock without ever learning it; and of every release that
// freed a lock (a holder cleared). Each entry says whether the server
// wrote the row on the fast path, the plain SQL's UPDATE, or in one of
// the lock's functions: the trigger's call stack (PG_CONTEXT) names the
// function whose statement fired it, and only the trigger itself when the
// client's statement did.
const modelGrantLogSQL = `
CREATE TABLE IF NOT EXISTS lmodel_grant (resource text NOT NULL, holder text NOT NULL, token bigint NOT NULL,
    fast boolean NOT NULL);
CREATE TABLE IF NOT EXISTS lmodel_release (resource text NOT NULL, holder text NOT NULL, fast boolean NOT NULL);
CREATE OR REPLACE FUNCTION lmodel_log_grant() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    stack text;
    fast boolean;
BEGIN
    GET DIAGNOSTICS stack = PG_CONTEXT;
    fast := position('function fencekit_' in stack) = 0;
    IF NEW.holder IS NOT NULL AND (TG_OP = 'INSERT' OR OLD.holder IS DISTINCT FROM NEW.holder
            OR OLD.token IS DISTINCT FROM NEW.token) THEN
        INSERT INTO lmodel_grant VALUES (NEW.resource, NEW.holder, NEW.token, fast);
    END IF;
    IF TG_OP = 'UPDATE' AND OLD.holder IS NOT NULL AND NEW.holder IS NULL THEN
        INSERT INTO lmodel_release VALUES (NEW.resource, OLD.holder, fast);
    END IF;
    RETURN NEW;
END
$$;
DROP TRIGGER IF EXISTS lmodel_grant ON fencekit_lock;
CREATE TRIGGER lmodel_grant AFTER INSERT OR UPDATE ON fencekit_lock
    FOR EACH ROW EXECUTE FUNCTION lmodel_log_grant();`

// modelDatabase creates a database of the test's own on the server at
// rawURL (any database of it), applies the migrations and the grant log,
// and drops the database when t ends. It returns the database's URL.
func modelDatabase(t *testing.T, rawURL string) string {
	t.Helper()
	ctx := ctxFor(t, 60*time.Second)
	dbURL, drop := testenv.PostgresDatabase(t, rawURL, "fencekit_lmodel_")
	t.Cleanup(drop)
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := migrations.UpPool(ctx, pool); err != nil {
		t.Fatalf("migrations: %v", err)
	}
	if _, err := pool.Exec(ctx, modelGrantLogSQL); err != nil {
		t.Fatalf("grant log: %v", err)
	}
	return dbURL
}

// drawDefaults sets, in two runs of three, defaults of the database at
// dbURL (the test's own) that its sessions take: an isolation level, and
// each of statement_timeout, lock_timeout and idle_session_timeout in one
// run of two; it logs them.
func drawDefaults(t *testing.T, dbURL string, seed uint64) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 11))
	if rng.IntN(3) == 0 {
		t.Log("database defaults of this run: the server's")
		return
	}
	settings := map[string]string{
		"default_transaction_isolation": []string{"read committed", "repeatable read", "serializable"}[rng.IntN(3)],
	}
	if rng.IntN(2) == 0 {
		settings["lock_timeout"] = "200ms"
	}
	if rng.IntN(2) == 0 {
		settings["statement_timeout"] = "500ms"
	}
	if rng.IntN(2) == 0 {
		settings["idle_session_timeout"] = "1s"
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t, 30*time.Second)
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for k, v := range settings {
		if _, err := conn.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{strings.TrimPrefix(u.Path, "/")}.Sanitize()+" SET "+k+" = '"+v+"'"); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("database defaults of this run: %v", settings)
}

// seenTracer tells the model the holder id of every grant attempt an
// actor's pool sends (the grant statement's second argument).
type seenTracer struct{ seen func(holder string) }

func (s seenTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if isGrantSQL(d.SQL) && len(d.Args) > 1 {
		if h, ok := d.Args[1].(string); ok {
			s.seen(h)
		}
	}
	return ctx
}

func (seenTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// pgModel is the model's PostgreSQL backend for one run: the actors'
// pools (closed by done), on actorsURL with application name app, and the
// watcher's, on dbURL.
type pgModel struct {
	t              *testing.T
	observer       *pgxpool.Pool
	actorsURL, app string

	sql statements // the actors' grant and release statements

	mu    sync.Mutex
	pools []*pgxpool.Pool
}

func newPgModel(t *testing.T, dbURL, actorsURL string) *pgModel {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 2
	cfg.ConnConfig.RuntimeParams["application_name"] = "fencekit_lmodel_watcher"
	// The watcher is not under test: the database's defaults a run draws
	// (drawDefaults) are the actors'.
	for k, v := range map[string]string{"statement_timeout": "0", "lock_timeout": "0", "idle_session_timeout": "0",
		"default_transaction_isolation": "read committed"} {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	observer, err := pgxpool.NewWithConfig(ctxFor(t, 10*time.Second), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(observer.Close)
	return &pgModel{t: t, observer: observer, actorsURL: actorsURL, app: "fencekit_lmodel_" + fence.NewHolder()[:12],
		sql: ownStatements}
}

// backend is the model's view of the lock on this database.
func (p *pgModel) backend() lockmodel.Backend {
	return lockmodel.Backend{
		Name:    "postgres",
		Locker:  p.locker,
		Observe: p.observe,
		Grants:  p.grants,
		Paths:   p.paths,
		Close:   p.done,
	}
}

func (p *pgModel) locker(_ int, seen func(string)) (*lock.Locker, error) {
	cfg, err := pgxpool.ParseConfig(p.actorsURL)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 2
	cfg.ConnConfig.RuntimeParams["application_name"] = p.app
	cfg.ConnConfig.Tracer = seenTracer{seen}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.pools = append(p.pools, pool)
	sql := p.sql
	p.mu.Unlock()
	return newWith(pool, &sql)
}

// done closes the actors' pools (after the run closed their Lockers).
func (p *pgModel) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pool := range p.pools {
		pool.Close()
	}
	p.pools = nil
}

func (p *pgModel) observe(ctx context.Context, resource string) (lockmodel.Observation, error) {
	var (
		o       lockmodel.Observation
		token   int64
		waiters []string
		lives   []int64
		floor   int64
		left    int64
	)
	err := p.observer.QueryRow(ctx, modelObserveSQL, resource).Scan(&o.Holder, &token, &waiters, &lives, &floor, &left)
	if err != nil {
		return o, err
	}
	if len(waiters) != len(lives) {
		return o, fmt.Errorf("observe: %d waiters, %d lives", len(waiters), len(lives))
	}
	o.Token, o.Floor, o.Left = fence.Token(token), fence.Token(floor), time.Duration(left)*time.Microsecond
	for i, w := range waiters {
		o.Waiters = append(o.Waiters, lockmodel.Waiter{Holder: w, Life: time.Duration(lives[i]) * time.Millisecond})
	}
	return o, nil
}

func (p *pgModel) grants(ctx context.Context, resource string) (map[string]fence.Token, error) {
	rows, err := p.observer.Query(ctx, `SELECT holder, min(token) FROM lmodel_grant WHERE resource = $1 GROUP BY holder`, resource)
	if err != nil {
		return nil, err
	}
	out := map[string]fence.Token{}
	for rows.Next() {
		var h string
		var tok int64
		if err := rows.Scan(&h, &tok); err != nil {
			return nil, err
		}
		out[h] = fence.Token(tok)
	}
	return out, rows.Err()
}

// paths reads which grants and releases of resource the server made on
// the fast path, from the log the trigger keeps.
func (p *pgModel) paths(ctx context.Context, resource string) (lockmodel.Paths, error) {
	out := lockmodel.Paths{Grants: map[string]bool{}, Releases: map[string]bool{}}
	rows, err := p.observer.Query(ctx, `SELECT holder, true FROM lmodel_grant WHERE resource = $1 AND fast
        UNION ALL SELECT holder, false FROM lmodel_release WHERE resource = $1 AND fast`, resource)
	if err != nil {
		return out, err
	}
	for rows.Next() {
		var h string
		var grant bool
		if err := rows.Scan(&h, &grant); err != nil {
			return out, err
		}
		if grant {
			out.Grants[h] = true
		} else {
			out.Releases[h] = true
		}
	}
	return out, rows.Err()
}

// terminate ends every connection of the actors' Lockers (their pools'
// and their LISTEN connections) with pg_terminate_backend.
func (p *pgModel) terminate(ctx context.Context) error {
	var n int
	err := p.observer.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`, p.app).Scan(&n)
	if err == nil && n == 0 {
		err = fmt.Errorf("no connection of the actors to terminate")
	}
	return err
}

// TestLockModelPostgres runs the lock model on the shared server, in a
// database of its own, and judges every check with its floor. Hand-over
// notices are lost (loseNotices).
func TestLockModelPostgres(t *testing.T) {
	testenv.Slow(t)
	db := modelDatabase(t, testenv.PostgresBaseURL(t))
	drawDefaults(t, db, lockmodel.Seed(t))
	p := newPgModel(t, db, db)
	defer loseNotices(t, p)()
	floors := modelFloors()
	r := lockmodel.Run(t, p.backend(), lockmodel.Config{Floors: floors, Uncontended: uncontended(t)})
	r.Report(t)
	r.Check(t, floors)
}

// loseNotices makes the notices of hand-overs to three waiters in four
// (by holder id) lost, all through a run, as they are when a listener's
// connection drops (fencekit_lock_notify replaced in the model's
// database): such a waiter finds the lock handed to it by its own try at
// the end of the lease before. That grant, found already held, has run on
// the server since the hand-over, and is believed only for what the
// server says is left of it, which the promise check judges on every
// observation (Observation.Left). It returns what puts the notices back.
func loseNotices(t *testing.T, p *pgModel) func() {
	return p.install(t, modelControl{name: "hand-over notices lost", edits: []modelEdit{{"fencekit_lock_notify",
		"PERFORM pg_notify(", "IF granted <> '-' AND hashtext(granted) % 4 <> 0 THEN RETURN; END IF;\n    PERFORM pg_notify("}}})
}

// uncontended is the phase of a run in which nobody queues (so that the
// plain SQL serves the grants and releases): a third of the budget.
func uncontended(t testing.TB) time.Duration { return lockmodel.Budget(t) / 3 }

// modelFloors are the model's floors on PostgreSQL: the default ones and
// the fast path's, which the uncontended phase makes.
func modelFloors() map[string]int {
	floors := lockmodel.DefaultFloors()
	floors[lockmodel.Release] = 10
	floors[lockmodel.FastGrantsJudged] = 10
	floors[lockmodel.FastReleasesJudged] = 5
	floors[lockmodel.LateReleaseMetFast] = 2
	// Waiting acquisitions granted: where hand-overs are made, and found
	// by the waiter's own try when its notice is lost (loseNotices).
	floors[grantsAcquire] = 10
	return floors
}

// grantsAcquire counts the model's waiting acquisitions granted.
const grantsAcquire = "grants: acquire"

// TestLockModelPostgresFaults runs the lock model on a private server
// under faults: pg_terminate_backend of the actors' connections, replies
// lost on their way through a proxy (the actors connect through it), and
// the server stopped and started again, from the uncontended phase on
// (a lost reply of the plain SQL's grant or release, retried). No check
// may fail; the faults must have happened.
//
// As in TestLockModelPostgres, hand-over notices are lost (loseNotices).
func TestLockModelPostgresFaults(t *testing.T) {
	testenv.Slow(t)
	srv := testenv.StartPostgres(t)
	db := modelDatabase(t, srv.URL())
	proxy := testenv.StartProxy(t, srv.Addr())
	u, err := url.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = proxy.Addr()
	p := newPgModel(t, db, u.String())
	defer loseNotices(t, p)()
	b := p.backend()
	b.Faults = []lockmodel.Fault{
		{Name: "pg_terminate_backend", Inject: p.terminate},
		{Name: "lost reply", Inject: func(ctx context.Context) error {
			lost := make(chan struct{})
			proxy.LoseNextReply(func() { close(lost) })
			select {
			case <-lost:
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			return nil
		}},
		{Name: "restart", Limit: 1, Inject: func(context.Context) error {
			srv.Restart()
			return nil
		}},
	}
	floors := lockmodel.DefaultFloors()
	// Faults take much of a short run: fewer states to judge.
	floors[lockmodel.Tokens] = 10
	floors[lockmodel.Anchor] = 3
	floors[lockmodel.Promise] = 10
	floors[lockmodel.Renewal] = 0
	floors[lockmodel.LateReleaseMet] = 0
	floors[lockmodel.FreeWithWaiter] = 0
	floors[lockmodel.WaiterAhead] = 0
	floors[lockmodel.Queue] = 0
	floors[lockmodel.Release] = 3
	floors[lockmodel.FastGrantsJudged] = 5
	floors[lockmodel.FastReleasesJudged] = 2
	floors[grantsAcquire] = 5
	r := lockmodel.Run(t, b, lockmodel.Config{Faults: true, Label: "faults", Floors: floors, Uncontended: uncontended(t)})
	r.Report(t)
	r.Check(t, floors)
	if f := proxy.Faults(); f.Lost == 0 {
		t.Errorf("no reply was lost through the proxy (%+v)", f)
	}
	for _, name := range []string{"pg_terminate_backend", "restart"} {
		if r.Count("faults: "+name) == 0 {
			t.Errorf("%s: not injected in this run", name)
		}
	}
}

// modelControl is a broken variant of the lock: its statements and the
// migrations' functions with one line each replaced, and the checks that
// must reject it. A grant and a release have a fast path, sent as plain
// SQL (grantSQL, releaseSQL, edited in the actors' statements), in front
// of the full one (the functions fencekit_lock_grant, whose own fast path
// is taken when the state changed between the two, and the _full
// functions): each break edits every path, as a bug in any would.
type modelControl struct {
	name     string
	edits    []modelEdit
	caughtBy []string
}

// modelEdit replaces old with new, once, in a function's definition, or
// in the actors' grant or release statement (function "grantSQL",
// "releaseSQL").
type modelEdit struct{ function, old, new string }

var modelControls = []modelControl{
	{
		// Every grant, the acquire's own and the hand-over's to a waiter,
		// reuses the resource's previous token.
		name: "token not raised",
		edits: []modelEdit{
			{"grantSQL",
				"token = round(date_part('epoch', now()) * 1000000)::bigint,",
				"token = l.token,"},
			{"fencekit_lock_grant",
				"token = round(date_part('epoch', t_now) * 1000000)::bigint,",
				"token = l.token,"},
			{"fencekit_lock_acquire_full",
				"token := greatest(r.token + 1, fencekit_lock_us(t_now));",
				"token := CASE WHEN r.token > 0 THEN r.token ELSE fencekit_lock_us(t_now) END;"},
			{"fencekit_lock_next",
				"t bigint := greatest(n + 1, floor(extract(epoch FROM t_now) * 1000000)::bigint);",
				"t bigint := CASE WHEN n > 0 THEN n ELSE floor(extract(epoch FROM t_now) * 1000000)::bigint END;"},
		},
		caughtBy: []string{lockmodel.Tokens, lockmodel.Anchor},
	},
	{
		// The lease's end counted on a client's clock, 400ms behind the
		// server's, as if the client passed its own time.
		name: "expiry on the client clock",
		edits: []modelEdit{
			{"grantSQL",
				"expires_at = now() + $3::bigint * interval '1 millisecond',",
				"expires_at = now() - interval '400 milliseconds' + $3::bigint * interval '1 millisecond',"},
			{"fencekit_lock_grant",
				"expires_at = t_now + p_lease_ms * interval '1 millisecond',",
				"expires_at = t_now - interval '400 milliseconds' + p_lease_ms * interval '1 millisecond',"},
			{"fencekit_lock_acquire_full",
				"expires_at = t_now + p_lease_ms * interval '1 millisecond',",
				"expires_at = t_now - interval '400 milliseconds' + p_lease_ms * interval '1 millisecond',"},
		},
		caughtBy: []string{lockmodel.Promise},
	},
	{
		name: "release without the holder check",
		edits: []modelEdit{
			{"releaseSQL",
				"l.holder = $2 AND l.expires_at > now()",
				"l.holder IS NOT NULL AND l.expires_at > now()"},
			{"fencekit_lock_release_full",
				"held := coalesce(r.holder = p_holder AND r.expires_at > t_now, false);",
				"held := coalesce(r.holder IS NOT NULL AND r.expires_at > t_now, false);"},
		},
		caughtBy: []string{lockmodel.Promise},
	},
	{
		// A try that finds the lock free takes it, though live waiters
		// are queued ahead of it.
		name: "queue not respected",
		edits: []modelEdit{
			{"grantSQL", "AND NOT l.waiting", "AND true"},
			{"fencekit_lock_grant", "AND NOT l.waiting", "AND true"},
			{"fencekit_lock_acquire_full",
				"IF ordered AND ahead < coalesce(my_id, 9223372036854775807) THEN",
				"IF false AND ahead < coalesce(my_id, 9223372036854775807) THEN"},
		},
		// A waiter whose own try takes the lock that way keeps its queue
		// entry, and its release hands the lock back to it: the release
		// check sees that.
		caughtBy: []string{lockmodel.Queue, lockmodel.Release},
	},
	// The breaks of the plain SQL alone, the uncontended path: the
	// functions stay right, so only the grants and releases the UPDATEs
	// serve go wrong, which the uncontended phase makes.
	{
		name: "token not raised (plain SQL)",
		edits: []modelEdit{
			{"grantSQL",
				"token = round(date_part('epoch', now()) * 1000000)::bigint,",
				"token = l.token,"},
		},
		caughtBy: []string{lockmodel.Tokens, lockmodel.Anchor},
	},
	{
		// The grant takes a lock whose lease has not ended.
		name: "expiry ignored (plain SQL)",
		edits: []modelEdit{
			{"grantSQL",
				"AND (l.holder IS NULL OR l.expires_at <= now())",
				"AND (l.holder IS NULL OR true)"},
		},
		caughtBy: []string{lockmodel.Promise},
	},
	{
		// A late release frees the lock another holder took since.
		name: "release without the holder check (plain SQL)",
		edits: []modelEdit{
			{"releaseSQL",
				"l.holder = $2 AND l.expires_at > now()",
				"l.holder IS NOT NULL AND l.expires_at > now()"},
		},
		caughtBy: []string{lockmodel.Promise, lockmodel.Release},
	},
	{
		// The release answers that its caller held the lock but leaves
		// it held: no promise is broken, the lock just stays taken.
		name: "release that keeps the lock (plain SQL)",
		edits: []modelEdit{
			{"releaseSQL",
				"SET holder = NULL, expires_at = NULL,",
				"SET holder = l.holder, expires_at = l.expires_at,"},
		},
		caughtBy: []string{lockmodel.Release},
	},
}

// statement is the actors' statement an edit names, or nil when it names
// a function.
func (p *pgModel) statement(name string) *string {
	switch name {
	case "grantSQL":
		return &p.sql.grant
	case "releaseSQL":
		return &p.sql.release
	}
	return nil
}

// TestLockModelPostgresControls installs each broken variant in a
// database of the test's own and runs the model on it with three seeds
// (a run goes on until its variant has gone wrong, for at most four times
// a third of the model's budget): each variant must be rejected, by the
// checks that should catch it, in most of them.
func TestLockModelPostgresControls(t *testing.T) {
	testenv.Slow(t)
	db := modelDatabase(t, testenv.PostgresBaseURL(t))
	p := newPgModel(t, db, db)
	var cs []lockmodel.Control
	for _, c := range modelControls {
		cs = append(cs, lockmodel.Control{Name: c.name, CaughtBy: c.caughtBy, Install: func(t testing.TB) (lockmodel.Backend, func()) {
			return p.backend(), p.install(t, c)
		}})
	}
	lockmodel.RunControls(t, cs, lockmodel.Budget(t)/lockmodel.ControlRuns, lockmodel.Config{Uncontended: uncontended(t)})
}

// install replaces, in the model's database, each function c edits with
// its edited definition, and the actors' statements c edits, and returns
// what puts the originals back.
func (p *pgModel) install(t testing.TB, c modelControl) (undo func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var defs []string
	undo = func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for i := len(defs) - 1; i >= 0; i-- {
			if _, err := p.observer.Exec(ctx, defs[i]); err != nil {
				t.Errorf("restore after %s: %v", c.name, err)
			}
		}
		p.mu.Lock()
		p.sql = ownStatements
		p.mu.Unlock()
	}
	for _, e := range c.edits {
		if stmt := p.statement(e.function); stmt != nil {
			if strings.Count(*stmt, e.old) != 1 {
				undo()
				t.Fatalf("%s: the line %q is not in %s once: update the control", c.name, e.old, e.function)
			}
			p.mu.Lock()
			*stmt = strings.Replace(*stmt, e.old, e.new, 1)
			p.mu.Unlock()
			continue
		}
		var def string
		if err := p.observer.QueryRow(ctx, `SELECT pg_get_functiondef($1::regproc)`, e.function).Scan(&def); err != nil {
			undo()
			t.Fatal(err)
		}
		if strings.Count(def, e.old) != 1 {
			undo()
			t.Fatalf("%s: the line %q is not in %s once: update the control", c.name, e.old, e.function)
		}
		if _, err := p.observer.Exec(ctx, strings.Replace(def, e.old, e.new, 1)); err != nil {
			undo()
			t.Fatalf("install %s: %v", c.name, err)
		}
		defs = append(defs, def)
	}
	return undo
}
