-- +goose Up
-- The PostgreSQL lock's grant, answering in one value, for the lock's
-- uncontended path sent as plain SQL.
--
-- Since this migration, package lock/pglock sends the uncontended grant and
-- release itself: one UPDATE of the lock's row in a WITH clause (the
-- uncontended case of migration 00007, the clock read as now()) and, in the
-- same statement, a function of the full path called only when that UPDATE
-- matched no row. A call of a PL/pgSQL function, even one that only runs
-- that UPDATE, costs the server more than the UPDATE; the plain statement
-- costs about what a plain UPDATE does. The release's fallback is
-- fencekit_lock_release_full (00007); the grant's is fencekit_lock_grant,
-- created here, as the statement must answer in one value whichever path
-- decided.
--
-- fencekit_lock_grant does what fencekit_lock_acquire does and answers the
-- same, as one bigint array:
--
--   {kind, token, remaining_ms}              from its fast path;
--   {kind, token, remaining_ms, place, ref}  from the full path, with 0
--                                            for a missing token,
--                                            remaining_ms or ref and -1
--                                            for a missing place.
--
-- kind, token, remaining_ms, place and ref mean what they mean for
-- fencekit_lock_acquire (migration 00006); the three-element answer has no
-- place (the fast path never takes a new row) and no queue entry. Its fast
-- path is 00007's (the lock may have come free between the statement's
-- UPDATE and the call), with the end of the token space tested inside the
-- comparison with the counter: a condition on the clock alone becomes a
-- plan node of its own, started on every call. From January 2255 no row matches and
-- fencekit_lock_acquire_full decides, in exact arithmetic, as before.
--
-- fencekit_lock_acquire and fencekit_lock_release stay, unchanged, for
-- clients of earlier versions and for this version on a database not yet
-- migrated: every path takes the same row lock and keeps the same rules,
-- so all may run side by side on one database.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencekit_lock_grant(p_resource text, p_holder text, p_lease_ms bigint,
    p_retention_ms bigint, p_life_ms integer, ordered boolean) RETURNS bigint[]
LANGUAGE plpgsql AS $$
DECLARE
    t_now timestamptz := clock_timestamp();
    reply bigint[];
BEGIN
    UPDATE fencekit_lock l SET holder = p_holder, token = round(date_part('epoch', t_now) * 1000000)::bigint,
        expires_at = t_now + p_lease_ms * interval '1 millisecond',
        retain_until = t_now + (p_lease_ms + p_retention_ms) * interval '1 millisecond'
    WHERE l.resource = p_resource AND l.token > 0 AND NOT l.waiting
      AND l.token < CASE WHEN t_now < '2255-01-01 00:00:00+00' THEN round(date_part('epoch', t_now) * 1000000)::bigint ELSE 0 END
      AND (l.holder IS NULL OR l.expires_at <= t_now)
    RETURNING ARRAY[1, l.token, p_lease_ms] INTO reply;
    IF FOUND THEN
        RETURN reply;
    END IF;
    SELECT ARRAY[f.kind, coalesce(f.token, 0), coalesce(f.remaining_ms, 0), coalesce(f.place, -1), coalesce(f.ref, 0)]
    INTO reply
    FROM fencekit_lock_acquire_full(p_resource, p_holder, p_lease_ms, p_retention_ms, p_life_ms, ordered) f;
    RETURN reply;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION IF EXISTS fencekit_lock_grant(text, text, bigint, bigint, integer, boolean);
