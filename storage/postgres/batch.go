package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fencekit/fencekit/fence"
)

// Statement is one SQL statement of a fenced batch. SQL holds $n
// placeholders; Args their values, in order. Quote identifiers with
// pgx.Identifier.Sanitize; never build values into SQL.
type Statement struct {
	SQL  string
	Args []any
}

// Exec runs the guard of f and stmts as one pipelined batch: one write to
// the server and one read of its answers in steady state, the same round
// trips as a single autocommit statement. On a pool or a connection the
// batch runs as one implicit transaction (pgx ends it with a single Sync):
// either f is admitted and every statement commits, or nothing does.
//
// A stale f makes the guard raise SQLSTATE [CodeStale], which aborts the
// batch before any statement runs; Exec then returns an error wrapping a [*fence.StaleError]
// carrying the mark f lost to. A failing statement aborts the batch too, the
// guard's mark included, and its error is returned. On success Exec returns
// the command tag of each statement, in order.
//
// On a pgx.Tx the batch joins that transaction, and an error leaves it
// aborted: roll it back. The first time a pool connection sees a statement,
// pgx prepares it in an extra round trip and caches it. ctx bounds the
// batch. If ctx ends, or the connection breaks, after the batch was sent and
// before its reply arrived, the batch may have committed: Exec then returns
// an error matching [fence.ErrOutcomeUnknown] as well as ctx.Err() or the
// network error (see "When the outcome is unknown" in the package doc). An
// error without it means nothing committed. If encoding an argument panics (a Value or Encode method is user code), the
// batch is not sent, the connection goes back to its pool and the panic
// continues.
func Exec(ctx context.Context, db Batcher, f fence.Fence, stmts ...Statement) ([]pgconn.CommandTag, error) {
	ctx, span := startSpan(ctx, "fencekit.postgres.exec", &f)
	tags, err := exec(ctx, db, f, stmts...)
	err = forHandle("Exec", err, db)
	endSpan(ctx, span, err)
	return tags, err
}

func exec(ctx context.Context, db Batcher, f fence.Fence, stmts ...Statement) ([]pgconn.CommandTag, error) {
	if err := checkCall(ctx, db, "db"); err != nil {
		return nil, err
	}
	if err := checkFence("Exec", f); err != nil {
		return nil, err
	}
	for i, s := range stmts {
		if s.SQL == "" {
			return nil, invalid("statement %d has no SQL", i)
		}
	}
	b := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, len(stmts)+1)}
	b.Queue(guardAdmitSQL, f.Resource, int64(f.Token), f.Holder)
	for _, s := range stmts {
		b.Queue(s.SQL, s.Args...)
	}
	commits := commitsItself(db)
	var tags []pgconn.CommandTag
	err := onConn(ctx, db, func(db Batcher) error {
		var err error
		tags, err = execBatch(ctx, db, b, f, len(stmts))
		if err != nil && commits {
			return unknownOutcome("postgres: Exec", err)
		}
		return err
	})
	if err != nil {
		var stale *fence.StaleError
		if errors.As(err, &stale) {
			return nil, prefixed("postgres: Exec", stale)
		}
		return nil, err
	}
	return tags, nil
}

// execBatch sends b, whose first statement is the guard of f, and returns the
// command tags of the n statements after it.
func execBatch(ctx context.Context, db Batcher, b *pgx.Batch, f fence.Fence, n int) (tags []pgconn.CommandTag, err error) {
	br := db.SendBatch(ctx, b)
	defer func() {
		if cerr := br.Close(); err == nil && cerr != nil {
			err = prefixed("postgres: fenced batch", translate(cerr, f))
		}
	}()
	if _, err := br.Exec(); err != nil {
		return nil, prefixed("postgres: fenced batch", translate(err, f))
	}
	tags = make([]pgconn.CommandTag, 0, n)
	for i := range n {
		tag, err := br.Exec()
		if err != nil {
			return nil, prefixed(fmt.Sprintf("postgres: fenced batch statement %d", i), translate(err, f))
		}
		tags = append(tags, tag)
	}
	return tags, nil
}

// Query is the one-round-trip fenced read: it pipelines the guard of f and
// stmt in one implicit transaction (on a pool or a connection) and, once f is
// admitted, hands stmt's rows to fn. The read happens after the guard raised
// the mark and while it holds the guard row, so no older holder can be
// admitted between it and a later fenced write of the same holder.
//
// A stale f returns an error wrapping a [*fence.StaleError] without calling fn. fn must not
// keep rows; an error from fn is returned as it is (the mark raise still
// commits, as with any admitted read). On a pgx.Tx the read joins that
// transaction. ctx bounds the batch and fn's reading. A batch whose reply
// is cut off (ctx ends or the connection breaks) returns an error matching
// [fence.ErrOutcomeUnknown], as [Exec] does: it may have committed. For a
// plain read the only write is the guard's mark raise, which a retry under
// the same fence repeats harmlessly.
//
// If fn panics, Query closes the batch, returns the connection to its pool
// and lets the panic continue with its original value. The guard's mark
// raise has already run by then and commits like any admitted read's.
func Query(ctx context.Context, db Batcher, f fence.Fence, stmt Statement, fn func(rows pgx.Rows) error) error {
	ctx, span := startSpan(ctx, "fencekit.postgres.query", &f)
	err := forHandle("Query", query(ctx, db, f, stmt, fn), db)
	endSpan(ctx, span, err)
	return err
}

func query(ctx context.Context, db Batcher, f fence.Fence, stmt Statement, fn func(rows pgx.Rows) error) error {
	if err := checkCall(ctx, db, "db"); err != nil {
		return err
	}
	if fn == nil {
		return invalid("nil rows function")
	}
	if err := checkFence("Query", f); err != nil {
		return err
	}
	if stmt.SQL == "" {
		return invalid("statement has no SQL")
	}
	b := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, 2)}
	b.Queue(guardAdmitSQL, f.Resource, int64(f.Token), f.Holder)
	b.Queue(stmt.SQL, stmt.Args...)
	commits := commitsItself(db)
	return onConn(ctx, db, func(db Batcher) error { return queryBatch(ctx, db, b, f, fn, commits) })
}

// queryBatch sends b, the guard of f and one query, and hands the query's
// rows to fn. The batch is closed even when fn panics, so that the connection
// is drained and, from a pool, given back. commits says whether the batch
// commits by itself, so that a failure in flight leaves its outcome unknown.
func queryBatch(ctx context.Context, db Batcher, b *pgx.Batch, f fence.Fence, fn func(rows pgx.Rows) error, commits bool) (err error) {
	failed := func(err error) error {
		err = prefixed("postgres: fenced query", translate(err, f))
		if commits {
			return unknownOutcome("postgres: Query", err)
		}
		return err
	}
	br := db.SendBatch(ctx, b)
	defer func() {
		if cerr := br.Close(); err == nil && cerr != nil {
			err = failed(cerr)
		}
	}()
	if _, err := br.Exec(); err != nil {
		var stale *fence.StaleError
		if err := translate(err, f); errors.As(err, &stale) {
			return prefixed("postgres: Query", stale)
		}
		return failed(err)
	}
	rows, err := br.Query()
	if err != nil {
		return failed(err)
	}
	defer rows.Close()
	if err := fn(rows); err != nil {
		return err
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return failed(err)
	}
	return nil
}
