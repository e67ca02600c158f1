package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/trace"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/telemetry"
)

// The completion table is created by migrations.UpMySQL in the connection's
// current database.
const (
	// onceClaimSQL writes key's completion record unless one exists: 1 row
	// when it wrote it, 0 when the key has a record. IGNORE turns only the
	// duplicate key into "0 rows" here, since every value is checked to fit
	// its column first. Against a record that another transaction wrote and
	// has not yet ended, it waits for that transaction, then counts 0 if it
	// committed and writes the record if it rolled back. The count does not
	// depend on clientFoundRows, which only concerns updates.
	onceClaimSQL = "INSERT IGNORE INTO fencekit_once (`key`, resource, token, holder, done_at)\n" +
		"VALUES (?, ?, ?, ?, UTC_TIMESTAMP(6))"

	// onceLookupSQL reads key's completion record with a shared locking
	// read: it sees the newest committed record whatever the snapshot of
	// the transaction it runs in, and waits for a transaction that is
	// writing the record (an Once in flight) to end. LOCK IN SHARE MODE is
	// understood by MySQL 8 (as FOR SHARE) and MariaDB alike.
	onceLookupSQL = "SELECT resource, token, holder, done_at FROM fencekit_once WHERE `key` = ? LOCK IN SHARE MODE"
)

// MaxOnceKeyLen is the longest key, in bytes, that [Once] and [LookupOnce]
// accept: the completion table's key column is VARBINARY(1024).
const MaxOnceKeyLen = fence.MaxResourceLen

// Once runs fn at most once per key: fn's work and a completion record for
// key commit in one transaction, and a key that has a record is never run
// again, whatever the fence, the process or the number of retries. It
// returns ran = true when this call's fn ran and its work committed, and
// ran = false with a nil error when key's work had already committed (fn
// is not called). ran means nothing when err is not nil.
//
// In one transaction Once guards f (as [InTx] does, so it never deadlocks
// on guard rows either), writes key's record
// (f's resource and token, the mark of its holder, fence.HolderMark, never
// the holder id, and the time), runs fn and commits. So:
//   - fn's error, or its panic, rolls everything back and records nothing:
//     the key can run later. The error is returned as it is; a panic
//     continues with its original value once the transaction is rolled
//     back and the connection returned;
//   - a stale f returns a [*fence.StaleError] without running fn, whether or
//     not the work is done;
//   - racing calls for the same key, with the same resource or different
//     ones: at most one commits the work. The record is written before fn
//     runs and the primary key lets one transaction hold it, so a rival
//     waits for that transaction to end and then returns ran = false (it
//     committed) or runs fn itself (it rolled back). When several rivals
//     wait for one that rolls back, InnoDB may pick one of them as a
//     deadlock victim: an error matching [ErrRetryable], and [Retry] then
//     returns ran = false or runs the work. A rival with the same resource
//     waits on the guard first and may be refused as stale instead;
//   - a call whose COMMIT is in flight when ctx ends or the connection
//     breaks returns an error matching [fence.ErrOutcomeUnknown]. Call Once
//     again with the same key (under the same fence, or a newer one): it
//     returns ran = false if the work committed and runs it if not. That is
//     the way out for any ambiguous outcome.
//
// fn must do all its work through tx: what it does elsewhere (an email, a
// call to another service) is not rolled back and may happen again when a
// call fails. When the work is already done, the guard's raise of the mark
// still commits, as with any admitted read.
//
// Records are kept until you delete them ([LookupOnce] reads one). Deleting
// key's record lets key's work run again: the next Once for key runs fn.
// Delete only keys whose work nobody will ask for again, for example
// records older than the oldest key your jobs can still be called with:
//
//	DELETE FROM fencekit_once WHERE done_at < UTC_TIMESTAMP() - INTERVAL 90 DAY
//
// (an index on done_at serves it), or one key on purpose, to redo its work:
// DELETE FROM fencekit_once WHERE `key` = ?.
//
// key is 1 to [MaxOnceKeyLen] bytes of valid UTF-8 without NUL bytes; a bad
// key, nil fn or db, or invalid f is refused before anything is sent. The
// transaction runs at the server's default isolation level. ctx bounds the
// whole call, fn included.
func Once(ctx context.Context, db *sql.DB, f fence.Fence, key string, fn TxFunc) (ran bool, err error) {
	ctx, span := startSpan(ctx, "fencekit.mysql.once", &f)
	ran, err = once(ctx, db, f, key, fn)
	if span != nil && span.IsRecording() {
		span.SetAttributes(telemetry.KeyOnceRan.Bool(ran))
	}
	endSpan(ctx, span, err)
	return ran, err
}

func once(ctx context.Context, db *sql.DB, f fence.Fence, key string, fn TxFunc) (bool, error) {
	if err := checkTx(ctx, "Once", db, nil, f, fn); err != nil {
		return false, err
	}
	if err := checkOnceKey(key); err != nil {
		return false, err
	}
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.SetAttributes(telemetry.KeyKey.String(key)) // valid UTF-8, checked above
	}
	ran := false
	err := runGuarded(ctx, db, nil, "mysql: Once", f, func(ctx context.Context, tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, onceClaimSQL, key, f.Resource, int64(f.Token), fence.HolderMark(f.Holder))
		if err != nil {
			return prefixed(fmt.Sprintf("mysql: once %q: completion record", key), translate(err, true))
		}
		claimed, err := res.RowsAffected()
		if err != nil {
			return prefixed(fmt.Sprintf("mysql: once %q: completion record", key), err)
		}
		if claimed == 0 {
			return nil // done already: commit the mark raise only
		}
		if err := fn(ctx, tx); err != nil {
			return translate(err, false)
		}
		ran = true
		return nil
	})
	if err != nil {
		return false, err
	}
	return ran, nil
}

// OnceRecord is the completion record of a key whose work [Once] committed.
// It names the holder by its mark, as logs, errors and spans do: the record
// never holds the holder id, the lock's secret.
type OnceRecord struct {
	// Key is the key of the work.
	Key string
	// Resource and Token are those of the fence the work ran under.
	Resource string
	Token    fence.Token
	// HolderMark is fence.HolderMark of that fence's holder id: compare it
	// with fence.HolderMark(f.Holder), or with the mark a log line shows.
	HolderMark string
	// Done is when the record was written, by the database server's clock,
	// in UTC.
	Done time.Time
}

// LookupOnce returns the completion record of key: which grant ran its work
// (its resource, token and holder mark) and when. A key whose work has not
// committed returns an error matching [fence.ErrNotFound]. The answer is the
// newest committed one whatever db is: a locking read sees past the snapshot
// of a *sql.Tx (one that read before the work committed still finds its
// record), and a key whose [Once] is in flight makes it wait for that Once
// to commit or roll back. In a *sql.Tx the read holds a shared lock on the
// key's record (or, when there is none, on the gap where it would go, at
// REPEATABLE READ and SERIALIZABLE) until the transaction ends, so a Once of
// that key waits for it. db may be a *sql.DB, a *sql.Conn or a *sql.Tx. It
// reads the record whatever the DSN's parseTime says. A bad key is refused
// before anything is sent. ctx bounds the query, including that wait.
func LookupOnce(ctx context.Context, db Querier, key string) (OnceRecord, error) {
	if err := checkCall(ctx, db, "db"); err != nil {
		return OnceRecord{}, err
	}
	if err := checkOnceKey(key); err != nil {
		return OnceRecord{}, err
	}
	rec := OnceRecord{Key: key}
	var token int64
	var done serverTime
	err := db.QueryRowContext(ctx, onceLookupSQL, key).Scan(&rec.Resource, &token, &rec.HolderMark, &done)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return OnceRecord{}, prefixed(fmt.Sprintf("mysql: once %q", key), fence.ErrNotFound)
	case err != nil:
		return OnceRecord{}, prefixed(fmt.Sprintf("mysql: once %q: completion record", key), translate(err, true))
	}
	rec.Token, rec.Done = fence.Token(token), time.Time(done)
	return rec, nil
}

// checkOnceKey refuses a key the completion table cannot hold exactly.
func checkOnceKey(key string) error {
	switch {
	case key == "":
		return invalid("empty once key")
	case len(key) > MaxOnceKeyLen:
		return invalid("once key of %d bytes is longer than mysql.MaxOnceKeyLen (%d)", len(key), MaxOnceKeyLen)
	case !utf8.ValidString(key) || strings.IndexByte(key, 0) >= 0:
		return invalid("once key %q is not valid UTF-8 or holds a NUL byte", key)
	}
	return nil
}

// serverTime scans a DATETIME column that holds UTC, whether the driver
// returns it as time.Time (parseTime=true) or as text.
type serverTime time.Time

// datetimeLayout is how MySQL writes a DATETIME(6) as text.
const datetimeLayout = "2006-01-02 15:04:05.999999"

func (t *serverTime) Scan(v any) error {
	switch v := v.(type) {
	case time.Time:
		// The driver read it in the DSN's loc; the digits are UTC.
		*t = serverTime(time.Date(v.Year(), v.Month(), v.Day(), v.Hour(), v.Minute(), v.Second(), v.Nanosecond(), time.UTC))
		return nil
	case []byte:
		return t.parse(string(v))
	case string:
		return t.parse(v)
	}
	return fmt.Errorf("mysql: cannot read %T as a DATETIME", v)
}

func (t *serverTime) parse(s string) error {
	p, err := time.ParseInLocation(datetimeLayout, s, time.UTC)
	if err != nil {
		return prefixed(fmt.Sprintf("mysql: DATETIME %q", s), err)
	}
	*t = serverTime(p)
	return nil
}
