package history

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/storage/pgsql"
)

// errRolledBack is what ownTxRMW returns for a transaction it rolled back
// after an error that was neither a refusal nor a serialization failure:
// surely not applied.
var errRolledBack = errors.New("history: rolled back before COMMIT")

// ownTx draws whether a read-modify-write runs in a transaction of the
// caller's own, guarded by pgsql.Guard (about one in three), rather than
// through pgsql.InTx: Guard judges with pgcore.GuardJudgeSQL and the
// function fencekit_guard_judge, a path InTx never takes.
func (r *sqlRun) ownTx() bool {
	r.levelMu.Lock()
	defer r.levelMu.Unlock()
	return r.levelRng.IntN(3) == 0
}

// ownTxRMW is txRMW's transaction begun by the caller at level, guarded by
// pgsql.Guard as its first statement, then read and written, then
// committed. A COMMIT that fails is an unknown outcome (it may have been
// applied); an error before it rolls the transaction back.
func (r *sqlRun) ownTxRMW(ctx context.Context, w int, level pgx.TxIsoLevel, f fence.Fence, key, d string, old *PgOut) error {
	tx, err := r.dbs[w].BeginTx(ctx, &sql.TxOptions{Isolation: sqlLevels[level]})
	if err != nil {
		return fmt.Errorf("%w: %w", errRolledBack, err)
	}
	err = pgsql.Guard(ctx, tx, f)
	if err == nil {
		err = tx.QueryRowContext(ctx, pgLockedReadSQL, key).Scan(&old.Data, &old.Version)
	}
	if err == nil {
		_, err = tx.ExecContext(ctx, pgWriteSQL, key, d)
	}
	if err != nil {
		_ = tx.Rollback()
		var stale *fence.StaleError
		if errors.As(err, &stale) || errors.Is(err, pgsql.ErrRetryable) {
			return err
		}
		if pe := (*pgconn.PgError)(nil); errors.As(err, &pe) && (pe.Code == "40001" || pe.Code == "40P01") {
			return fmt.Errorf("%w: %w", pgsql.ErrRetryable, err)
		}
		return fmt.Errorf("%w: %w", errRolledBack, err)
	}
	if err := tx.Commit(); err != nil {
		return &fence.OutcomeUnknownError{Op: "commit", Err: err}
	}
	return nil
}
