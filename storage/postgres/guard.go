package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/pgcore"
)

// The guard table and function are created by the migrations package and
// found through the connection's search_path. The statements are
// storage/pgsql's too, so both packages keep one mark per resource.
const (
	// guardSQL admits (resource, token, holder) and writes the mark, or
	// returns no row when the fence is stale; see pgcore.GuardSQL.
	guardSQL = pgcore.GuardSQL

	// highWaterSQL reads a resource's mark.
	highWaterSQL = pgcore.HighWaterSQL

	// guardAdmitSQL is the raising form of guardSQL, for pipelined batches:
	// a stale fence fails with SQLSTATE CodeStale and aborts the transaction.
	guardAdmitSQL = pgcore.GuardAdmitSQL
)

// Guard admits f inside tx by the rule of [fence.Admits], as one statement on
// the guard table (an upsert that writes the guard row on every admission,
// so that a newer holder at REPEATABLE READ or SERIALIZABLE conflicts with
// this transaction's commit; see the package doc). On success the resource's high-water mark is
// (f.Token, f.Holder) and its guard row stays locked until tx ends, so that
// other holders of the resource wait for tx and then see its mark: call Guard
// before reading or writing what the resource protects, and those reads and
// writes are fenced.
//
// A stale f returns an error wrapping a [*fence.StaleError] (errors.Is(err, fence.ErrStale))
// whose HighWater is the mark f lost to, and changes nothing. tx remains
// usable, but it too holds the guard row lock (the upsert locks the row it
// refused to update, which is what makes the reported mark exact), so roll
// it back promptly. At REPEATABLE READ and SERIALIZABLE a
// concurrent raise of the mark surfaces as an error matching [ErrRetryable].
// ctx bounds the statements, including the wait for the row lock.
//
// The guard must stand at the top level of tx, outside any savepoint: a
// rollback to a savepoint taken before it (pgx's Tx.Begin on a transaction
// makes one, and so does an ORM's nested transaction) undoes the mark and
// releases the row lock, and the rest of tx runs unfenced while a newer
// holder commits. So Guard checks, in the same round trip (one batch), that
// the row it admitted is held by tx's top level; inside a savepoint it
// returns an error matching [fence.ErrInvalid] that says so, and tx must be
// rolled back. [InTx], [Exec], [Query] and [Once] guard at the top level by
// construction.
//
// The guard table's marks protect only what is fenced through it; row-level
// marks kept by a [Table] are separate, and neither checks the other.
func Guard(ctx context.Context, tx pgx.Tx, f fence.Fence) error {
	ctx, span := startSpan(ctx, "fencekit.postgres.guard", &f)
	err := guardChecked(ctx, tx, f)
	endSpan(ctx, span, err)
	return err
}

func guardChecked(ctx context.Context, tx pgx.Tx, f fence.Fence) error {
	if err := checkCall(ctx, tx, "tx"); err != nil {
		return err
	}
	if err := checkFence("Guard", f); err != nil {
		return err
	}
	return guardTop(ctx, tx, "Guard", f)
}

// guardTop is guard for a transaction of the caller's, which may stand
// inside a savepoint (pgx's Tx.Begin makes one): the guard and the check
// that it stands at the top level (pgcore.TopLevelMarkSQL, which also reads
// the mark the guard judged) go in one batch, one round trip, and a guard
// inside a savepoint is refused. A stale refusal carries the mark from that
// batch.
func guardTop(ctx context.Context, tx pgx.Tx, call string, f fence.Fence) error {
	b := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, 2)}
	b.Queue(guardSQL, f.Resource, int64(f.Token), f.Holder)
	b.Queue(pgcore.TopLevelMarkSQL, f.Resource)
	br := tx.SendBatch(ctx, b)
	var admitted, top bool
	var token int64
	mark := fence.Fence{Resource: f.Resource}
	gerr := br.QueryRow().Scan(&admitted)
	terr := br.QueryRow().Scan(&top, &token, &mark.Holder)
	mark.Token = fence.Token(token)
	if err := br.Close(); gerr == nil && terr == nil {
		terr = err
	}
	switch {
	case errors.Is(gerr, pgx.ErrNoRows) && terr == nil:
		// Stale, and the row the guard locked gave its mark.
		return prefixed("postgres: guard", &fence.StaleError{Fence: f, HighWater: mark})
	case gerr != nil:
		return guarded(ctx, tx, f, gerr)
	case terr != nil:
		return prefixed(fmt.Sprintf("postgres: %s: savepoint check of %q", call, f.Resource), translate(terr, f))
	case !top:
		return invalid("%s of %q: %s", call, f.Resource, pgcore.SavepointHint)
	}
	return nil
}

func guard(ctx context.Context, tx pgx.Tx, f fence.Fence) error {
	var admitted bool
	err := tx.QueryRow(ctx, guardSQL, f.Resource, int64(f.Token), f.Holder).Scan(&admitted)
	if err == nil {
		return nil
	}
	return guarded(ctx, tx, f, err)
}

// guarded is the error of a guard statement that returned err: a stale
// refusal (no row) with the mark f lost to, or the translated error.
func guarded(ctx context.Context, tx pgx.Tx, f fence.Fence, err error) error {
	if !errors.Is(err, pgx.ErrNoRows) {
		return prefixed(fmt.Sprintf("postgres: guard %s", f), translate(err, f))
	}
	// Stale. The upsert left the row locked by tx, so this read sees the
	// mark that refused f, not a later one.
	mark, err := highWater(ctx, tx, f.Resource)
	if err != nil {
		return err
	}
	return prefixed("postgres: guard", &fence.StaleError{Fence: f, HighWater: mark})
}

// GuardAll guards several resources in one transaction, as [Guard] does for
// one. It locks their guard rows in ascending order of resource name,
// whatever the order of fences, so two transactions guarding overlapping sets
// can never deadlock on guard rows. A resource may appear only once. On the
// first stale fence it returns that fence's [*fence.StaleError]; marks raised
// before it are part of tx, which the caller must roll back. Its span
// carries the resources and tokens, in the order they are locked.
func GuardAll(ctx context.Context, tx pgx.Tx, fences ...fence.Fence) error {
	ctx, span := startSpan(ctx, "fencekit.postgres.guard_all", nil)
	err := guardAll(ctx, tx, fences...)
	endSpan(ctx, span, err)
	return err
}

func guardAll(ctx context.Context, tx pgx.Tx, fences ...fence.Fence) error {
	if err := checkCall(ctx, tx, "tx"); err != nil {
		return err
	}
	// Each guard's batch checks its level too (all stand at one), and
	// reads the mark a refusal carries.
	return store.GuardAll(ctx, fences,
		func(f fence.Fence) error { return checkFence("GuardAll", f) },
		func(f fence.Fence) error { return guardTop(ctx, tx, "GuardAll", f) })
}

// HighWater returns the high-water mark of resource: the newest fence the
// guard table admitted for it, or a Fence with a zero Token when it never
// admitted one. A lock whose counter was lost can advance it past the mark's
// token. db may be a pool, a connection or a transaction (whose snapshot then
// applies). A resource that no fence could carry ([fence.Fence.Validate]'s
// rule: empty, longer than [fence.MaxResourceLen], not valid UTF-8 or
// holding a NUL byte) is refused with an error matching both
// [fence.ErrInvalid] before anything is sent:
// the guard table cannot hold a mark for it. ctx bounds the query.
func HighWater(ctx context.Context, db Querier, resource string) (fence.Fence, error) {
	if err := checkCall(ctx, db, "db"); err != nil {
		return fence.Fence{}, err
	}
	// The resource rule is fence.Validate's own, applied through a fence
	// whose other fields are valid, so that HighWater accepts exactly the
	// resources that Guard, Exec and the rest accept.
	if err := (fence.Fence{Resource: resource, Token: 1, Holder: "-"}).Validate(); err != nil {
		return fence.Fence{}, invalid("high-water mark: %w", err)
	}
	mark, err := highWater(ctx, db, resource)
	return mark, forHandle("HighWater", err, db)
}

func highWater(ctx context.Context, db Querier, resource string) (fence.Fence, error) {
	mark := fence.Fence{Resource: resource}
	var token int64
	err := db.QueryRow(ctx, highWaterSQL, resource).Scan(&token, &mark.Holder)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return mark, nil
	case err != nil:
		return fence.Fence{}, prefixed(fmt.Sprintf("postgres: high-water mark of %q", resource), translate(err, fence.Fence{Resource: resource}))
	}
	mark.Token = fence.Token(token)
	return mark, nil
}
