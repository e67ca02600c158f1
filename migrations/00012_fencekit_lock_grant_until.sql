-- +goose Up
-- The PostgreSQL lock's grant with a deadline, and the release that voids a
-- late grant.
--
-- A grant's request can reach the server after its caller gave up: held
-- in the network past the caller's deadline, or past a retry on another
-- connection that the caller then released. Run then, it would grant the
-- lock to a holder nobody has, for its whole lease. Package lock/pglock
-- therefore sends every grant with a deadline on the server's clock
-- (p_not_after: no later than the caller's deadline, mapped onto the
-- server's clock from a reading of clock_timestamp(), so that it is never
-- later on the server than the caller's deadline is on the client), and
-- after the caller gave up it calls fencekit_lock_void once the deadline
-- has passed: a grant run before the deadline is released by it, and a
-- grant that would run after it is refused. Every decision is taken with
-- the row locked and the clock read after the lock, so the two cannot
-- cross.
--
-- fencekit_lock_grant_until is fencekit_lock_grant (migration 00008) that
-- first locks the row (creating it) and answers {3, 0, 0} without any
-- change when clock_timestamp() has passed p_not_after: too late, the
-- caller has gone. The plain SQL grant of lock/pglock checks the same
-- deadline in its uncontended UPDATE; fencekit_lock_void writes the row
-- before it releases, so that such an UPDATE which read the row before the
-- void checks the deadline again on the written row (PostgreSQL evaluates
-- the WHERE clause again, clock included, on a row updated meanwhile).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencekit_lock_grant_until(p_resource text, p_holder text, p_lease_ms bigint,
    p_retention_ms bigint, p_life_ms integer, ordered boolean, p_not_after timestamptz) RETURNS bigint[]
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM fencekit_lock_row(p_resource);
    IF clock_timestamp() > p_not_after THEN
        RETURN ARRAY[3, 0, 0]::bigint[];
    END IF;
    RETURN fencekit_lock_grant(p_resource, p_holder, p_lease_ms, p_retention_ms, p_life_ms, ordered);
END
$$;
-- +goose StatementEnd

-- fencekit_lock_void releases holder's grant of resource and takes its
-- queue entry out, as fencekit_lock_release_full(..., true) does, after
-- writing the row (when there is one) so that no grant that read the row
-- earlier can still land unchecked. It answers whether holder held the
-- lock.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencekit_lock_void(p_resource text, p_holder text, p_retention_ms bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE fencekit_lock SET token = token WHERE resource = p_resource;
    RETURN fencekit_lock_release_full(p_resource, p_holder, p_retention_ms, true);
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION IF EXISTS fencekit_lock_void(text, text, bigint);
DROP FUNCTION IF EXISTS fencekit_lock_grant_until(text, text, bigint, bigint, integer, boolean, timestamptz);
