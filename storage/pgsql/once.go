package pgsql

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
	"github.com/fencekit/fencekit/internal/pgcore"
	"github.com/fencekit/fencekit/internal/telemetry"
)

// MaxOnceKeyLen is the longest key, in bytes, that [Once] and [LookupOnce]
// accept: the same bound as a resource name, well inside the primary key
// index's row limit.
const MaxOnceKeyLen = fence.MaxResourceLen

// Once runs fn at most once per key: fn's work and a completion record for
// key commit in one transaction, and a key that has a record is never run
// again, whatever the fence, the process, the package (storage/postgres
// keeps its records in the same table) or the number of retries. It returns
// ran = true when this call's fn ran and its work committed, and ran = false
// with a nil error when key's work had already committed (fn is not
// called). ran means nothing when err is not nil.
//
// In one transaction Once guards f (as [InTx] does), writes key's record
// (f's resource and token, the mark of its holder, fence.HolderMark, never
// the holder id, and the time), runs fn and commits. So:
//   - fn's error, or its panic, rolls everything back and records nothing:
//     the key can run later. The error is returned as it is; a panic
//     continues with its original value once the transaction is rolled
//     back and the connection returned;
//   - a stale f returns an error wrapping a [*fence.StaleError] without
//     running fn, whether or not the work is done;
//   - racing calls for the same key, with the same resource or different
//     ones: exactly one commits the work. The record is written before fn
//     runs and the primary key lets one transaction hold it, so a rival
//     waits for that transaction to end and then returns ran = false (it
//     committed) or runs fn itself (it rolled back). A rival with the same
//     resource waits on the guard first and may be refused as stale
//     instead;
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
// key's record lets key's work run again. Delete only keys whose work nobody
// will ask for again, for example:
//
//	DELETE FROM fencekit_once WHERE done_at < now() - interval '90 days'
//
// key is 1 to [MaxOnceKeyLen] bytes of valid UTF-8 without NUL bytes; a bad
// key, nil fn or db, or invalid f is refused before anything is sent. The
// transaction runs at the server's default isolation; at REPEATABLE READ or
// SERIALIZABLE a rival that committed the key after this one's snapshot
// makes it fail with [ErrRetryable], and running Once again returns
// ran = false. ctx bounds the whole call, fn included.
func Once(ctx context.Context, db *sql.DB, f fence.Fence, key string, fn TxFunc) (ran bool, err error) {
	ctx, span := startSpan(ctx, "fencekit.pgsql.once", &f)
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
	form := guardFormOf(ctx, db)
	err := runTx(ctx, db, nil, "pgsql: Once", func(ctx context.Context, tx *sql.Tx) error {
		if err := admit(ctx, form, tx, f); err != nil {
			return err
		}
		var claimed bool
		err := tx.QueryRowContext(ctx, pgcore.OnceClaimSQL, key, f.Resource, int64(f.Token), fence.HolderMark(f.Holder)).Scan(&claimed)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return nil // done already: commit the mark raise only
		case err != nil:
			return prefixed(fmt.Sprintf("pgsql: once %q: completion record", key), translate(err))
		}
		if err := fn(ctx, tx); err != nil {
			return translate(err)
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
	// Done is when the transaction that ran the work began, by the database
	// server's clock (now() in that transaction).
	Done time.Time
}

// LookupOnce returns the completion record of key: which grant ran its work
// (its resource, token and holder mark) and when. A key whose work has not
// committed returns an error matching [fence.ErrNotFound]. db may be a
// *sql.DB, a *sql.Conn or a *sql.Tx (whose snapshot then applies). A bad key
// is refused before anything is sent. ctx bounds the query.
func LookupOnce(ctx context.Context, db Querier, key string) (OnceRecord, error) {
	if err := checkCall(ctx, db, "db"); err != nil {
		return OnceRecord{}, err
	}
	if err := checkOnceKey(key); err != nil {
		return OnceRecord{}, err
	}
	rec := OnceRecord{Key: key}
	var token int64
	err := db.QueryRowContext(ctx, pgcore.OnceLookupSQL, key).Scan(&rec.Resource, &token, &rec.HolderMark, &rec.Done)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return OnceRecord{}, prefixed(fmt.Sprintf("pgsql: once %q", key), fence.ErrNotFound)
	case err != nil:
		return OnceRecord{}, prefixed(fmt.Sprintf("pgsql: once %q: completion record", key), translate(err))
	}
	rec.Token = fence.Token(token)
	return rec, nil
}

// checkOnceKey refuses a key the completion table cannot hold.
func checkOnceKey(key string) error {
	switch {
	case key == "":
		return invalid("empty once key")
	case len(key) > MaxOnceKeyLen:
		return invalid("once key of %d bytes is longer than pgsql.MaxOnceKeyLen (%d)", len(key), MaxOnceKeyLen)
	case !utf8.ValidString(key) || strings.IndexByte(key, 0) >= 0:
		return invalid("once key %q is not valid UTF-8 or holds a NUL byte", key)
	}
	return nil
}
