-- +goose Up
-- Two functions, one rule: fencekit_guard_admit (replaced, for the batch)
-- raises on a stale fence; fencekit_guard_try (new, for transactions)
-- returns false instead. Both take the row lock and write only on a change.
--
-- fencekit_guard_admit keeps its rule, its SQLSTATE FK001 and its DETAIL,
-- and writes a new version of the guard row only when the mark changes: a
-- batch that presents the fence already holding the mark (every batch of a
-- lease after its first) locks the row and writes nothing, where 00002's
-- function rewrote it every time.
--
-- The first SELECT locks the row. FOR UPDATE waits for a holder's
-- transaction and returns the row version it locked, which may be newer
-- than the statement's snapshot at READ COMMITTED: the function judges that
-- version, never the snapshot, or a holder whose mark a newer holder raised
-- while it waited would be admitted. When the locked row holds this very
-- fence, the function admits without writing. Otherwise the conditional
-- upsert of 00002 judges: it locks the conflicting row even when the
-- admission fails, and it waits for and judges a row that another
-- transaction inserted after the snapshot. The mark read after a refusal
-- is therefore the one that refused the fence.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencekit_guard_admit(p_resource text, p_token bigint, p_holder text)
RETURNS void
LANGUAGE plpgsql
VOLATILE
AS $$
DECLARE
    hw_token  bigint;
    hw_holder text;
BEGIN
    SELECT g.token, g.holder INTO hw_token, hw_holder
    FROM fencekit_guard AS g WHERE g.resource = p_resource FOR UPDATE;
    IF FOUND AND hw_token = p_token AND hw_holder = p_holder THEN
        RETURN;
    END IF;
    INSERT INTO fencekit_guard AS g (resource, token, holder)
    VALUES (p_resource, p_token, p_holder)
    ON CONFLICT (resource) DO UPDATE
        SET token = EXCLUDED.token, holder = EXCLUDED.holder, updated_at = now()
        WHERE EXCLUDED.token > g.token
           OR (EXCLUDED.token = g.token AND EXCLUDED.holder = g.holder);
    IF FOUND THEN
        RETURN;
    END IF;
    SELECT g.token, g.holder INTO hw_token, hw_holder
    FROM fencekit_guard AS g WHERE g.resource = p_resource;
    RAISE EXCEPTION 'fencekit: stale fence for resource %: token % lost to token %', p_resource, p_token, hw_token
        USING ERRCODE = 'FK001',
              DETAIL = json_build_object('token', hw_token, 'holder', hw_holder)::text;
END
$$;
-- +goose StatementEnd

-- fencekit_guard_try is the same admission as fencekit_guard_admit, for the
-- transaction paths (storage/postgres's InTx, Guard and GuardAll, and
-- storage/pgsql's): it returns true when it admitted the fence and false
-- when the fence is stale, without raising, so the caller's transaction
-- stays usable and holds the guard row lock either way. As a function its
-- plans are kept by the session, where a statement that holds the same
-- logic is planned again on every call by drivers that do not prepare it
-- (lib/pq, pgx's simple protocol).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencekit_guard_try(p_resource text, p_token bigint, p_holder text)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
AS $$
DECLARE
    hw_token  bigint;
    hw_holder text;
BEGIN
    SELECT g.token, g.holder INTO hw_token, hw_holder
    FROM fencekit_guard AS g WHERE g.resource = p_resource FOR UPDATE;
    IF FOUND AND hw_token = p_token AND hw_holder = p_holder THEN
        RETURN true;
    END IF;
    INSERT INTO fencekit_guard AS g (resource, token, holder)
    VALUES (p_resource, p_token, p_holder)
    ON CONFLICT (resource) DO UPDATE
        SET token = EXCLUDED.token, holder = EXCLUDED.holder, updated_at = now()
        WHERE EXCLUDED.token > g.token
           OR (EXCLUDED.token = g.token AND EXCLUDED.holder = g.holder);
    RETURN FOUND;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION fencekit_guard_try(text, bigint, text);

-- 00002's function, which writes the guard row on every admission.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencekit_guard_admit(p_resource text, p_token bigint, p_holder text)
RETURNS void
LANGUAGE plpgsql
VOLATILE
AS $$
DECLARE
    hw_token  bigint;
    hw_holder text;
BEGIN
    INSERT INTO fencekit_guard AS g (resource, token, holder)
    VALUES (p_resource, p_token, p_holder)
    ON CONFLICT (resource) DO UPDATE
        SET token = EXCLUDED.token, holder = EXCLUDED.holder, updated_at = now()
        WHERE EXCLUDED.token > g.token
           OR (EXCLUDED.token = g.token AND EXCLUDED.holder = g.holder);
    IF FOUND THEN
        RETURN;
    END IF;
    SELECT g.token, g.holder INTO hw_token, hw_holder
    FROM fencekit_guard AS g WHERE g.resource = p_resource;
    RAISE EXCEPTION 'fencekit: stale fence for resource %: token % lost to token %', p_resource, p_token, hw_token
        USING ERRCODE = 'FK001',
              DETAIL = json_build_object('token', hw_token, 'holder', hw_holder)::text;
END
$$;
-- +goose StatementEnd
