package pglock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/lockbackend"
	"github.com/fencekit/fencekit/internal/pgcore"
	"github.com/fencekit/fencekit/lock"
)

// Timings of the backend.
const (
	// pollMin is the first delay before the listener connects again after
	// its connection broke; it doubles up to lockbackend.QueueRefresh.
	pollMin = 10 * time.Millisecond
	// cleanupBound bounds the background release of a grant whose caller
	// gave up while it was in flight, and Close's wait for it.
	cleanupBound = 2 * time.Second
	// reclaimBatch is how many rows one reclaim deletes at most.
	reclaimBatch = 1000
	// olderSchemaProbe is how long grants and releases take the older
	// statements after migration 00008 was found missing.
	olderSchemaProbe = time.Minute
)

// querier is what the backend needs of its pool: one statement at a time.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// backend is the PostgreSQL lock: grants, releases, extensions, waiting
// in arrival order and the record beside the lock, each one statement on
// the server's clock.
type backend struct {
	db        querier
	sql       statements
	pool      *pgxpool.Pool
	retention time.Duration
	listen    *listener     // nil when waiters poll
	life      time.Duration // how long an entry lives unrefreshed

	// On a database without migration 00008, grants and releases go to
	// fencekit_lock_acquire and fencekit_lock_release, which answer the
	// same, until olderUntil (time since born; 0: never); the newer
	// statements are tried again every probeOlder.
	born       time.Time
	olderUntil atomic.Int64
	probeOlder time.Duration

	// The mapping of the client's clock onto the server's (see
	// serverDeadline), and the requests that may still be granted after
	// their callers give up (see lockbackend.LateRequests).
	clock     atomic.Pointer[clockRef]
	clockBusy atomic.Bool
	late      lockbackend.LateRequests
	noVoid    bool          // a control of the tests: grants without deadline, no void
	window    time.Duration // grantWindow, or a test's

	bg     sync.WaitGroup // background releases and the reclaimer
	stop   chan struct{}
	closed sync.Once
}

// config is what a backend is made with.
type config struct {
	retention time.Duration
	poll      bool          // no LISTEN: waiters poll with backoff
	reclaim   time.Duration // how often idle rows are reclaimed; 0: never
	sql       *statements   // nil: the package's own
	// meters is where the listener's failures are counted (nil: the
	// global provider).
	meters metric.MeterProvider
	// listenVia, when set, is the pool whose settings the listener
	// connects with (tests route it through a proxy); nil: pool.
	listenVia *pgxpool.Pool
	// noVoid is a control of the tests: grants are sent without a
	// deadline and no void follows a caller that gave up, as before
	// migration 00012 (a late grant then stands for its lease).
	noVoid bool
	// window replaces grantWindow (tests; 0: grantWindow).
	window time.Duration
}

// statements are a backend's grant and release statements: grantSQL,
// releaseSQL and leaveSQL, which tests replace with broken ones.
type statements struct{ grant, release, leave string }

var ownStatements = statements{grant: grantSQL, release: releaseSQL, leave: leaveSQL}

// callStatements are the statements for a pool whose statements are not
// prepared once per connection (see grantCallSQL).
var callStatements = statements{grant: grantCallSQL, release: releaseCallSQL, leave: leaveCallSQL}

// statementsFor are the statements that cost pool's server least: the
// plain SQL when pool keeps statements prepared (pgx's default,
// QueryExecModeCacheStatement), the function calls otherwise (the simple
// protocol, as behind PgBouncer's transaction mode before it kept
// prepared statements, and the modes that use the unnamed statement).
func statementsFor(pool *pgxpool.Pool) statements {
	if pool.Config().ConnConfig.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement {
		return ownStatements
	}
	return callStatements
}

func newBackend(pool *pgxpool.Pool, cfg config) *backend {
	b := &backend{db: newRetrying(pool), pool: pool, retention: cfg.retention, stop: make(chan struct{}),
		life: lockbackend.QueueLife, born: time.Now(), probeOlder: olderSchemaProbe, noVoid: cfg.noVoid, window: cfg.window}
	if b.window <= 0 {
		b.window = grantWindow
	}
	b.sql = statementsFor(pool)
	if cfg.sql != nil {
		b.sql = *cfg.sql
	}
	if !cfg.poll {
		lp := pool
		if cfg.listenVia != nil {
			lp = cfg.listenVia
		}
		b.listen = newListener(lp, listenerReporter(cfg.meters))
	}
	if cfg.reclaim > 0 {
		b.bg.Add(1)
		go b.reclaimLoop(cfg.reclaim)
	}
	// Map the client's clock onto the server's before the first grant
	// needs it (a grant that comes first reads it itself).
	b.refreshClock()
	return b
}

// close stops the listener and the reclaimer and waits, within
// grantWindow and cleanupBound, for background releases and voids.
func (b *backend) close() {
	b.closed.Do(func() {
		close(b.stop)
		if b.listen != nil {
			b.listen.close()
		}
		done := make(chan struct{})
		go func() { b.bg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(grantWindow + cleanupBound + time.Second):
		}
	})
}

// grant is a lease the server granted: its token and what was left of it
// when the server answered.
type grant struct {
	token     fence.Token
	remaining time.Duration
	fromClock bool // no row was found: the token came from the clock alone
	retried   bool // already held by this holder (a retry or a hand-over)
}

// refusal is a refused try: what is left of the current lease, and the
// caller's place in the queue (-1 when it did not queue).
type refusal struct {
	remaining time.Duration
	place     int
	ref       int64 // the caller's queue entry as refreshed (µs); 0 when not queued
}

func ms(d time.Duration) int64 { return d.Milliseconds() }

// checkArgs refuses bad input before anything is sent.
func checkArgs(ctx context.Context, op, resource, holder string, ttl time.Duration, needTTL bool) error {
	if ctx == nil {
		return invalid("%s %q: nil context", op, resource)
	}
	if resource == "" {
		return invalid("%s: empty resource name", op)
	}
	if len(resource) > fence.MaxResourceLen {
		return invalid("%s: resource name of %d bytes is longer than %d", op, len(resource), fence.MaxResourceLen)
	}
	if err := (fence.Fence{Resource: resource, Token: 1, Holder: "h"}).Validate(); err != nil {
		return invalid("%s: %v", op, err)
	}
	if holder == "" || !utf8.ValidString(holder) || strings.ContainsRune(holder, 0) {
		return invalid("%s %q: holder id empty, not valid UTF-8 or holding a NUL byte", op, resource)
	}
	if needTTL {
		if ttl < time.Millisecond {
			return invalid("%s %q: lease %v is shorter than 1ms", op, resource, ttl)
		}
		if ttl > lock.MaxTTL {
			return invalid("%s %q: lease %v is longer than %v", op, resource, ttl, lock.MaxTTL)
		}
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("pglock: %s %q: %w", op, resource, err)
	}
	return nil
}

// try makes one attempt to grant resource to holder for ttl, in one round
// trip (two, once a minute, on a database without migration 00008: the
// newer statement tried, then the older one). life > 0 queues a refused
// caller with that entry life; ordered makes a free lock go to the first
// live waiter ahead of the caller. It returns the grant, or a refusal (nil
// error), or an error.
func (b *backend) try(ctx context.Context, op, resource, holder string, ttl, life time.Duration, ordered bool) (*grant, *refusal, error) {
	if err := checkArgs(ctx, op, resource, holder, ttl, true); err != nil {
		return nil, nil, err
	}
	var lifeArg any
	if life > 0 {
		lifeArg = int32(ms(life))
	}
	args := []any{resource, holder, ms(ttl), ms(b.retention), lifeArg, ordered, nil}
	for tries := 1; !b.olderSchema(); tries++ {
		// The grant's deadline: the caller's, or grantWindow from now.
		late := time.Now().Add(b.window)
		if d, ok := ctx.Deadline(); ok && d.Before(late) {
			late = d
		}
		if b.noVoid {
			args[6] = "infinity" // the control: no deadline, no void
		} else {
			at, err := b.serverDeadline(ctx, late)
			if err != nil {
				return nil, nil, translate(ctx, op, resource, err)
			}
			args[6] = at
		}
		var reply []int64
		row := b.grantRow(ctx, b.sql.grant, args...)
		err := row.Scan(&reply)
		if rr, ok := row.(*retryRow); ok && rr.ranBefore || err != nil && mayHaveRun(err) {
			// This request (an earlier try of it, or the one whose
			// reply was lost) may still be granted until late.
			b.late.Note(resource, holder, late)
		}
		if err == nil {
			if len(reply) != 3 && len(reply) != 5 {
				return nil, nil, fmt.Errorf("pglock: %s %q: a reply of %d values", op, resource, len(reply))
			}
			if reply[0] == replyTooLate {
				// The server reached the request past its deadline and
				// changed nothing: send it again while the caller waits.
				if cerr := ctx.Err(); cerr != nil {
					return nil, nil, fmt.Errorf("pglock: %s %q: %w", op, resource, cerr)
				}
				if tries < tooLateTries {
					continue
				}
				return nil, nil, fmt.Errorf("pglock: %s %q: the server reached the grant after its deadline %d times (is its clock stepping back?)", op, resource, tries)
			}
			place, ref := int64(-1), int64(0)
			if len(reply) == 5 {
				place, ref = reply[3], reply[4]
			}
			return answer(op, resource, reply[0], reply[1], reply[2], place, ref)
		}
		if !olderSchemaError(err) {
			return nil, nil, translate(ctx, op, resource, err)
		}
		// The database lacks migration 00012 (or 00008): the statement
		// failed, so nothing ran; fencekit_lock_acquire answers the same,
		// without a deadline.
		b.markOlderSchema()
	}
	var (
		kind  int32
		token *int64
		rem   *int64
		place *int32
		ref   *int64
	)
	if err := b.grantRow(ctx, acquireSQL, args[:6]...).Scan(&kind, &token, &rem, &place, &ref); err != nil {
		return nil, nil, translate(ctx, op, resource, err)
	}
	valueOr := func(p *int64, none int64) int64 {
		if p == nil {
			return none
		}
		return *p
	}
	placeOr := int64(-1)
	if place != nil {
		placeOr = int64(*place)
	}
	return answer(op, resource, int64(kind), valueOr(token, 0), valueOr(rem, 0), placeOr, valueOr(ref, 0))
}

// grantRow runs a grant statement: as b.db.QueryRow does, but a timeout
// the database or role sets is not lifted (see retrying.grantRow).
func (b *backend) grantRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if r, ok := b.db.(retrying); ok {
		return r.grantRow(ctx, sql, args...)
	}
	return b.db.QueryRow(ctx, sql, args...)
}

// answer reads a grant statement's reply: kind, the token (0: none), what
// is left of the lease in ms, the caller's place (-1: none; 1 on a grant:
// the row was new) and its queue entry (0: none).
func answer(op, resource string, kind, token, rem, place, ref int64) (*grant, *refusal, error) {
	remaining := time.Duration(rem) * time.Millisecond
	switch kind {
	case replyGranted, replyHeld:
		if token < 1 {
			return nil, nil, fmt.Errorf("pglock: %s %q: the server granted no token", op, resource)
		}
		g := &grant{token: fence.Token(token), remaining: remaining, retried: kind == replyHeld}
		g.fromClock = kind == replyGranted && place == 1
		return g, nil, nil
	case replyRefused:
		return nil, &refusal{remaining: remaining, place: int(place), ref: ref}, nil
	}
	return nil, nil, fmt.Errorf("pglock: %s %q: unknown reply kind %d", op, resource, kind)
}

// olderSchemaError reports whether err says the database lacks what
// grantSQL and releaseSQL need: fencekit_lock_grant (migration 00008),
// fencekit_lock_release_full or the column fencekit_lock.waiting (00007).
// A database without the lock's tables at all is not older but
// unmigrated: the older statements then fail with ErrNotMigrated.
func olderSchemaError(err error) bool {
	s, ok := serverError(err)
	if !ok {
		return false
	}
	switch s.Code {
	case pgcore.CodeUndefinedFunction:
		return strings.Contains(s.Message, "fencekit_lock_grant") || strings.Contains(s.Message, "fencekit_lock_release_full") ||
			strings.Contains(s.Message, "fencekit_lock_void")
	case pgcore.CodeUndefinedColumn:
		return strings.Contains(s.Message, "waiting")
	}
	return false
}

// olderSchema reports whether grants and releases go to
// fencekit_lock_acquire and fencekit_lock_release, because the database
// lacked migration 00008 when last tried, less than b.probeOlder ago.
func (b *backend) olderSchema() bool {
	until := b.olderUntil.Load()
	return until != 0 && time.Since(b.born) < time.Duration(until)
}

// markOlderSchema sends grants and releases to the older statements for
// b.probeOlder, after which the newer ones are tried again: a database
// migrated while the Locker runs gets them from then on.
func (b *backend) markOlderSchema() {
	b.olderUntil.Store(int64(time.Since(b.born) + b.probeOlder))
}

// tryAcquire is one attempt that respects the queue without joining it.
// If the attempt's outcome is unknown (ctx ended or the connection broke
// with the request sent), whatever it may have taken is released in the
// background, so no lock is left that nobody knows about.
func (b *backend) tryAcquire(ctx context.Context, resource, holder string, ttl time.Duration) (*grant, error) {
	g, r, err := b.try(ctx, "TryAcquire", resource, holder, ttl, 0, true)
	if err != nil {
		if mayHaveRun(err) {
			b.releaseInBackground(resource, holder, false)
		}
		b.giveUp(resource, holder)
		return nil, err
	}
	if r != nil {
		// Refused, and done: a request of this try's that a retry
		// answered in its place may still grant (see lockbackend.LateRequests).
		b.giveUp(resource, holder)
		return nil, &lock.NotAcquiredError{Resource: resource, Remaining: r.remaining}
	}
	return g, nil
}

// release frees resource if holder holds it, handing it to the first live
// waiter in the same statement. It reports whether holder held it.
func (b *backend) release(ctx context.Context, resource, holder string) (bool, error) {
	return b.releaseAs(ctx, "Release", resource, holder, false)
}

func (b *backend) releaseAs(ctx context.Context, op, resource, holder string, leaving bool) (bool, error) {
	if err := checkArgs(ctx, op, resource, holder, 0, false); err != nil {
		return false, err
	}
	var held bool
	if !b.olderSchema() {
		q := b.sql.release
		if leaving {
			q = b.sql.leave
		}
		err := b.db.QueryRow(ctx, q, resource, holder, ms(b.retention)).Scan(&held)
		if err == nil {
			return held, nil
		}
		if !olderSchemaError(err) {
			return false, translate(ctx, op, resource, err)
		}
		b.markOlderSchema()
	}
	if err := b.db.QueryRow(ctx, oldReleaseSQL, resource, holder, ms(b.retention), leaving).Scan(&held); err != nil {
		return false, translate(ctx, op, resource, err)
	}
	return held, nil
}

// releaseInBackground releases (leaving: and dequeues) holder's grant of
// resource after its caller gave up, within cleanupBound.
func (b *backend) releaseInBackground(resource, holder string, leaving bool) {
	b.bg.Add(1)
	go func() {
		defer b.bg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), cleanupBound)
		defer cancel()
		for {
			_, err := b.releaseAs(ctx, "release", resource, holder, leaving)
			if err == nil || ctx.Err() != nil || !mayHaveRun(err) && !isConnErr(err) {
				return
			}
			// The connection broke: a fresh one from the pool tries again;
			// a release run twice is a release.
			select {
			case <-ctx.Done():
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
}

// isConnErr reports whether err is a broken connection (or a session the
// server ended, FATAL) rather than a server's answer to the statement.
func isConnErr(err error) bool {
	s, isServer := serverError(err)
	return !isServer || s.Final
}

// extend lengthens holder's lease of resource to at least ttl from now and
// returns what is left of it; lock.ErrNotHeld when holder does not hold it.
func (b *backend) extend(ctx context.Context, resource, holder string, ttl time.Duration) (time.Duration, error) {
	if err := checkArgs(ctx, "Extend", resource, holder, ttl, true); err != nil {
		return 0, err
	}
	var rem int64
	if err := b.db.QueryRow(ctx, extendSQL, resource, holder, ms(ttl), ms(b.retention)).Scan(&rem); err != nil {
		return 0, translate(ctx, "Extend", resource, err)
	}
	if rem == notHeld {
		return 0, fmt.Errorf("pglock: Extend %q: %w", resource, lock.ErrNotHeld)
	}
	return time.Duration(rem) * time.Millisecond, nil
}

// recordNewerError is setRecord's refusal when the record names a newer
// token than the writer's: the writer was deposed.
type recordNewerError struct{ token fence.Token }

func (e *recordNewerError) Error() string {
	return fmt.Sprintf("pglock: the record names a newer grant, token %d", e.token)
}

// setRecord writes value as the record beside resource's lock, for the
// grant (holder, token) only while it holds the lock, keeps it at least
// linger past the lease, and notifies watchers. lock.ErrNotHeld when it
// does not hold it; a *recordNewerError when the record names a newer
// token.
func (b *backend) setRecord(ctx context.Context, resource, holder string, token fence.Token, value string, linger time.Duration) error {
	if err := checkArgs(ctx, "SetRecord", resource, holder, 0, false); err != nil {
		return err
	}
	if token < 1 || token > fence.MaxToken {
		return invalid("SetRecord %q: token %d out of range", resource, token)
	}
	if !utf8.ValidString(value) || strings.ContainsRune(value, 0) {
		return invalid("SetRecord %q: value is not valid UTF-8 or holds a NUL byte", resource)
	}
	var r int64
	if err := b.db.QueryRow(ctx, setRecordSQL, resource, holder, int64(token), value, ms(linger)).Scan(&r); err != nil {
		return translate(ctx, "SetRecord", resource, err)
	}
	switch {
	case r == recordWritten:
		return nil
	case r < 0:
		return &recordNewerError{token: fence.Token(-r)}
	}
	return fmt.Errorf("pglock: SetRecord %q: %w", resource, lock.ErrNotHeld)
}

// keepRecord keeps the record of grant (holder, token) at least linger
// past its lease; lock.ErrNotHeld when the lock or the record is no longer
// that grant's.
func (b *backend) keepRecord(ctx context.Context, resource, holder string, token fence.Token, linger time.Duration) error {
	if err := checkArgs(ctx, "KeepRecord", resource, holder, 0, false); err != nil {
		return err
	}
	var kept bool
	if err := b.db.QueryRow(ctx, keepRecordSQL, resource, holder, int64(token), ms(linger)).Scan(&kept); err != nil {
		return translate(ctx, "KeepRecord", resource, err)
	}
	if !kept {
		return fmt.Errorf("pglock: KeepRecord %q: %w", resource, lock.ErrNotHeld)
	}
	return nil
}

// ttl is what is left of holder's lease of resource; lock.ErrNotHeld when
// holder does not hold it.
func (b *backend) ttl(ctx context.Context, resource, holder string) (time.Duration, error) {
	if err := checkArgs(ctx, "TTL", resource, holder, 0, false); err != nil {
		return 0, err
	}
	var rem int64
	if err := b.db.QueryRow(ctx, ttlSQL, resource, holder).Scan(&rem); err != nil {
		return 0, translate(ctx, "TTL", resource, err)
	}
	if rem == notHeld {
		return 0, fmt.Errorf("pglock: TTL %q: %w", resource, lock.ErrNotHeld)
	}
	return time.Duration(rem) * time.Millisecond, nil
}

// advance raises resource's token counter to at least atLeast.
func (b *backend) advance(ctx context.Context, resource string, atLeast fence.Token) error {
	if err := checkArgs(ctx, "Advance", resource, "-", 0, false); err != nil {
		return err
	}
	if atLeast < 1 || atLeast > fence.MaxToken {
		return invalid("Advance %q: token %d out of range", resource, atLeast)
	}
	var n int64
	if err := b.db.QueryRow(ctx, advanceSQL, resource, int64(atLeast), ms(b.retention)).Scan(&n); err != nil {
		return translate(ctx, "Advance", resource, err)
	}
	return nil
}

// record is the record beside resource's lock while the grant that wrote
// it holds the lock; ok is false otherwise.
type record struct {
	value  string
	token  fence.Token
	holder string
}

func (b *backend) record(ctx context.Context, resource string) (record, bool, error) {
	if err := checkArgs(ctx, "Record", resource, "-", 0, false); err != nil {
		return record{}, false, err
	}
	var (
		rec   record
		token int64
	)
	err := b.db.QueryRow(ctx, recordSQL, resource).Scan(&rec.value, &token, &rec.holder)
	if errors.Is(err, pgx.ErrNoRows) {
		return record{}, false, nil
	}
	if err != nil {
		return record{}, false, translate(ctx, "Record", resource, err)
	}
	rec.token = fence.Token(token)
	return rec, true, nil
}

// reclaim deletes up to max rows of idle resources whose retention has
// passed, and lapsed queue entries; it returns how many lock rows went.
func (b *backend) reclaim(ctx context.Context, max int) (int, error) {
	var n int32
	if err := b.db.QueryRow(ctx, reclaimSQL, int32(max)).Scan(&n); err != nil {
		return 0, translate(ctx, "reclaim", "*", err)
	}
	return int(n), nil
}

// reclaimLoop reclaims idle rows every period until the backend closes.
func (b *backend) reclaimLoop(period time.Duration) {
	defer b.bg.Done()
	lockbackend.ReclaimEvery(b.stop, period, reclaimBatch, b.reclaim)
}

// watchRecord subscribes to writes of the record beside resource's lock:
// each delivers the written token (as decimal text), and "" when the
// listener reconnected (a write may have been missed: read the record).
// It returns nil when the backend polls; stop with unwatch.
func (b *backend) watchRecord(resource string) *subscription {
	if b.listen == nil {
		return nil
	}
	return b.listen.subscribe("r:" + mark(resource))
}

func (b *backend) unwatch(s *subscription) {
	if s != nil {
		b.listen.unsubscribe(s)
	}
}
