-- +goose Up
-- fencekit_guard_judge is fencekit_guard_try (migration 00005) for a guard
-- in the caller's own transaction (storage/pgsql's Guard and GuardAll),
-- which must stay usable after a refusal: one call admits or refuses by the
-- same rule, and returns in the same statement what such a caller would
-- otherwise read in statements of its own:
--   - admitted: whether the fence was admitted;
--   - top_level: whether the guard row is held by the transaction itself
--     rather than by a savepoint inside it (a rollback to which would undo
--     the guard and release the row), judged as pgcore.TopLevelSQL does:
--     the row version was written (xmin) or locked (xmax) by the top-level
--     transaction;
--   - mark_token, mark_holder: the mark after the call: the fence when
--     admitted, and when refused the mark that refused it.
--
-- The rule is 00005's, on the row version the function locks: the first
-- SELECT locks the row with FOR UPDATE, which at READ COMMITTED waits for a
-- holder's transaction and returns the row version it locked, not the one
-- in the statement's snapshot. When the locked row holds this very fence,
-- it admits without writing. Otherwise the conditional upsert judges: it
-- locks the conflicting row even when the admission fails, and waits for
-- and judges a row that another transaction inserted after the snapshot.
-- After a refusal the row stays locked by the caller's transaction, and
-- the function reads the mark in a statement of its own, whose snapshot
-- (READ COMMITTED: taken after the lock; REPEATABLE READ and SERIALIZABLE:
-- a lock on a version newer than the snapshot has failed the call with a
-- serialization failure) shows the version that refused the fence.
--
-- The function has no exception block, which would open a subtransaction
-- of its own: its locks and writes belong to the caller's transaction or
-- savepoint, which is what top_level reports.
-- +goose StatementBegin
CREATE FUNCTION fencekit_guard_judge(p_resource text, p_token bigint, p_holder text,
    OUT admitted boolean, OUT top_level boolean, OUT mark_token bigint, OUT mark_holder text)
LANGUAGE plpgsql
VOLATILE
AS $$
DECLARE
    hw_token  bigint;
    hw_holder text;
BEGIN
    SELECT g.token, g.holder INTO hw_token, hw_holder
    FROM fencekit_guard AS g WHERE g.resource = p_resource FOR UPDATE;
    admitted := FOUND AND hw_token = p_token AND hw_holder = p_holder;
    IF NOT admitted THEN
        INSERT INTO fencekit_guard AS g (resource, token, holder)
        VALUES (p_resource, p_token, p_holder)
        ON CONFLICT (resource) DO UPDATE
            SET token = EXCLUDED.token, holder = EXCLUDED.holder, updated_at = now()
            WHERE EXCLUDED.token > g.token
               OR (EXCLUDED.token = g.token AND EXCLUDED.holder = g.holder);
        admitted := FOUND;
    END IF;
    SELECT g.token, g.holder,
           g.xmin::text::bigint = txid_current() % 4294967296
               OR g.xmax::text::bigint = txid_current() % 4294967296
    INTO mark_token, mark_holder, top_level
    FROM fencekit_guard AS g WHERE g.resource = p_resource;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION fencekit_guard_judge(text, bigint, text);
