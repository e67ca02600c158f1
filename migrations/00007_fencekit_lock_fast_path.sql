-- +goose Up
-- The PostgreSQL lock's uncontended path: a grant of a free lock and a
-- release that hands nothing over are each one UPDATE of the lock's row.
--
-- Before this migration both began by locking the row (SELECT ... FOR
-- UPDATE, itself a write of the row's header), looked at the wait queue,
-- and then wrote the row: about twice the server time of a plain UPDATE.
-- Now each function first tries a single UPDATE whose WHERE clause holds
-- every condition of the uncontended case, and only when it matches no row
-- takes the path of migration 00006, unchanged in what it answers.
--
-- fencekit_lock.waiting says whether the resource's queue may hold
-- entries: true from the first entry on, false only while it holds none.
-- Every entry is added with the row locked, by fencekit_lock_enqueue, which
-- sets the flag; the flag is cleared only with the row locked, by a
-- statement that has just seen the queue empty. So a false flag proves the
-- queue empty and the fast path need not look at fencekit_lock_waiter; a
-- true flag whose entries are gone (lapsed entries the reclaimer deleted)
-- sends the next grant or release down the full path, which clears it.
ALTER TABLE fencekit_lock ADD COLUMN IF NOT EXISTS waiting boolean NOT NULL DEFAULT false;
UPDATE fencekit_lock l SET waiting = true
WHERE NOT l.waiting AND EXISTS (SELECT 1 FROM fencekit_lock_waiter w WHERE w.resource = l.resource);

-- fencekit_lock_acquire answers as in 00006. Its fast path grants a free
-- lock (released, or its lease over) whose queue is empty: then neither
-- ordered nor life_ms changes the outcome, and the caller has no entry to
-- take out. It takes only a row whose counter the clock has passed, so
-- that the token (fencekit_lock_next: max(counter + 1, the clock in µs))
-- is the clock, and the row is kept (fencekit_lock_keep) the retention
-- past the lease's end; anything else (the counter ahead of the clock, no
-- row yet, a holder, a queue, the end of the token space) goes to
-- fencekit_lock_acquire_full, the path of 00006. The fast path is kept
-- small: PL/pgSQL compiles every expression of a statement anew in each
-- transaction, and a function's unused code still costs each call.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencekit_lock_acquire(p_resource text, p_holder text, p_lease_ms bigint,
    p_retention_ms bigint, p_life_ms integer, ordered boolean,
    OUT kind integer, OUT token bigint, OUT remaining_ms bigint, OUT place integer, OUT ref bigint)
LANGUAGE plpgsql AS $$
DECLARE
    t_now timestamptz := clock_timestamp();
BEGIN
    -- The token is the clock in µs, in floating point (date_part), which
    -- costs far less than extract's numeric and is off by less than a µs
    -- before 2255; the token space ends (2^53 - 1 µs) in June 2255, and
    -- from that January on the full path decides, in exact arithmetic.
    -- Expressions are written in the statement, and the reply set by its
    -- RETURNING: each declaration or assignment costs an expression of its
    -- own.
    UPDATE fencekit_lock l SET holder = p_holder, token = round(date_part('epoch', t_now) * 1000000)::bigint,
        expires_at = t_now + p_lease_ms * interval '1 millisecond',
        retain_until = t_now + (p_lease_ms + p_retention_ms) * interval '1 millisecond'
    WHERE l.resource = p_resource AND l.token > 0 AND NOT l.waiting
      AND l.token < round(date_part('epoch', t_now) * 1000000)::bigint
      AND (l.holder IS NULL OR l.expires_at <= t_now) AND t_now < '2255-01-01 00:00:00+00'
    RETURNING 1, l.token, p_lease_ms INTO kind, token, remaining_ms;
    IF NOT FOUND THEN
        SELECT * INTO kind, token, remaining_ms, place, ref
        FROM fencekit_lock_acquire_full(p_resource, p_holder, p_lease_ms, p_retention_ms, p_life_ms, ordered);
    END IF;
END
$$;
-- +goose StatementEnd

-- fencekit_lock_acquire_full is fencekit_lock_acquire of 00006, which also
-- sets the row's flag from the queue when it grants.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencekit_lock_acquire_full(p_resource text, p_holder text, p_lease_ms bigint,
    p_retention_ms bigint, p_life_ms integer, ordered boolean,
    OUT kind integer, OUT token bigint, OUT remaining_ms bigint, OUT place integer, OUT ref bigint)
LANGUAGE plpgsql AS $$
DECLARE
    r fencekit_lock;
    t_now timestamptz;
    granted text;
    fresh boolean;
    my_id bigint;
    ahead bigint;
BEGIN
    -- The row, locked (fencekit_lock_row, written out).
    LOOP
        SELECT * INTO r FROM fencekit_lock WHERE resource = p_resource FOR UPDATE;
        EXIT WHEN FOUND;
        INSERT INTO fencekit_lock (resource, token, retain_until)
        VALUES (p_resource, 0, clock_timestamp())
        ON CONFLICT (resource) DO NOTHING;
    END LOOP;
    t_now := clock_timestamp();
    IF r.holder IS NOT NULL AND r.expires_at > t_now THEN
        remaining_ms := fencekit_lock_ms(r.expires_at, t_now);
        IF r.holder = p_holder THEN
            PERFORM fencekit_lock_dequeue(p_resource, p_holder, remaining_ms, t_now);
            kind := 2;
            token := r.token;
            RETURN;
        END IF;
        kind := 0;
        SELECT e.place, e.ref INTO place, ref FROM fencekit_lock_enqueue(p_resource, p_holder, p_lease_ms, p_life_ms, t_now) e;
        RETURN;
    END IF;
    IF ordered OR p_life_ms IS NOT NULL THEN
        -- One look at the queue: the first entry of another waiter, and
        -- this caller's own.
        SELECT min(id) FILTER (WHERE waiter <> p_holder), min(id) FILTER (WHERE waiter = p_holder)
        INTO ahead, my_id FROM fencekit_lock_waiter WHERE resource = p_resource;
    END IF;
    IF ordered AND ahead < coalesce(my_id, 9223372036854775807) THEN
        granted := fencekit_lock_hand_over(r, t_now, p_retention_ms);
        SELECT * INTO r FROM fencekit_lock WHERE resource = p_resource;
        IF granted = p_holder THEN
            -- Every entry ahead had lapsed: the grant went to this caller.
            kind := 1;
            token := r.token;
            remaining_ms := p_lease_ms;
            RETURN;
        END IF;
        IF granted IS NOT NULL THEN
            kind := 0;
            remaining_ms := fencekit_lock_ms(r.expires_at, t_now);
            SELECT e.place, e.ref INTO place, ref FROM fencekit_lock_enqueue(p_resource, p_holder, p_lease_ms, p_life_ms, t_now) e;
            RETURN;
        END IF;
        -- Nobody ahead was live, and the lapsed entries (this caller's
        -- too, if it had lapsed) are gone.
        my_id := NULL;
    END IF;
    fresh := r.token = 0;
    -- fencekit_lock_next, written out.
    token := greatest(r.token + 1, fencekit_lock_us(t_now));
    IF token > 9007199254740991 THEN
        RAISE EXCEPTION 'token space exhausted: the next token would pass 2^53-1'
            USING ERRCODE = 'FK002';
    END IF;
    -- The flag is set again from the queue as it stands, the row locked:
    -- a flag left over from entries that lapsed is cleared here.
    UPDATE fencekit_lock SET holder = p_holder, token = fencekit_lock_acquire_full.token,
        expires_at = t_now + p_lease_ms * interval '1 millisecond',
        retain_until = fencekit_lock_keep(fencekit_lock_acquire_full.token, t_now + p_lease_ms * interval '1 millisecond', p_retention_ms),
        waiting = EXISTS (SELECT 1 FROM fencekit_lock_waiter w WHERE w.resource = p_resource)
    WHERE resource = p_resource;
    IF my_id IS NOT NULL THEN
        PERFORM fencekit_lock_dequeue(p_resource, p_holder, p_lease_ms, t_now);
    END IF;
    kind := 1;
    remaining_ms := p_lease_ms;
    IF fresh THEN
        place := 1;
    END IF;
END
$$;
-- +goose StatementEnd

-- fencekit_lock_enqueue answers as in 00006, and flags the row: its
-- callers hold the row locked.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencekit_lock_enqueue(p_resource text, p_holder text, p_lease_ms bigint,
    p_life_ms integer, t_now timestamptz, OUT place integer, OUT ref bigint)
LANGUAGE plpgsql AS $$
DECLARE
    my_id bigint;
BEGIN
    IF p_life_ms IS NULL THEN
        RETURN;
    END IF;
    INSERT INTO fencekit_lock_waiter AS w (resource, waiter, refreshed, life_ms, lease_ms)
    VALUES (p_resource, p_holder, t_now, p_life_ms, p_lease_ms)
    ON CONFLICT (resource, waiter) DO UPDATE
        SET refreshed = EXCLUDED.refreshed, life_ms = EXCLUDED.life_ms, lease_ms = EXCLUDED.lease_ms
    RETURNING w.id INTO my_id;
    UPDATE fencekit_lock SET waiting = true WHERE resource = p_resource AND NOT waiting;
    place := (SELECT count(*) FROM fencekit_lock_waiter
        WHERE resource = p_resource AND id < my_id
          AND refreshed + fencekit_lock_waiter.life_ms * interval '1 millisecond' >= t_now);
    ref := fencekit_lock_us(t_now);
END
$$;
-- +goose StatementEnd

-- fencekit_lock_dequeue answers as in 00006, and clears the row's flag when
-- the entry it took out was the last: its callers hold the row locked.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencekit_lock_dequeue(p_resource text, p_holder text, remaining_ms bigint,
    t_now timestamptz) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    my_id bigint;
BEGIN
    DELETE FROM fencekit_lock_waiter WHERE resource = p_resource AND waiter = p_holder
    RETURNING id INTO my_id;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    UPDATE fencekit_lock SET waiting = false
    WHERE resource = p_resource AND waiting
      AND NOT EXISTS (SELECT 1 FROM fencekit_lock_waiter w WHERE w.resource = p_resource);
    -- Among the first three live entries: fewer than three live ones
    -- were ahead of it.
    IF (SELECT count(*) FROM fencekit_lock_waiter WHERE resource = p_resource AND id < my_id
            AND refreshed + life_ms * interval '1 millisecond' >= t_now) < 3 THEN
        PERFORM fencekit_lock_notify(p_resource, '-', 0, 0, 0, remaining_ms, t_now);
    END IF;
END
$$;
-- +goose StatementEnd

-- fencekit_lock_release answers as in 00006. Its fast path frees a lock
-- its caller holds, live, with an empty queue (nothing to hand over,
-- nobody to tell) and a counter the clock has passed (the row is kept the
-- retention from now); anything else, and a leaving waiter (its entry
-- goes), takes fencekit_lock_release_full, the path of 00006.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencekit_lock_release(p_resource text, p_holder text, p_retention_ms bigint,
    leaving boolean) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    t_now timestamptz := clock_timestamp();
BEGIN
    IF NOT leaving THEN
        UPDATE fencekit_lock l SET holder = NULL, expires_at = NULL,
            retain_until = t_now + p_retention_ms * interval '1 millisecond'
        WHERE l.resource = p_resource AND l.holder = p_holder AND l.expires_at > t_now AND NOT l.waiting
          AND l.token <= round(date_part('epoch', t_now) * 1000000)::bigint;
        IF FOUND THEN
            RETURN true;
        END IF;
    END IF;
    RETURN fencekit_lock_release_full(p_resource, p_holder, p_retention_ms, leaving);
END
$$;
-- +goose StatementEnd

-- fencekit_lock_release_full is fencekit_lock_release of 00006, which also
-- clears the row's flag when it leaves the queue empty.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencekit_lock_release_full(p_resource text, p_holder text, p_retention_ms bigint,
    leaving boolean) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    r fencekit_lock;
    t_now timestamptz;
    held boolean;
BEGIN
    SELECT * INTO r FROM fencekit_lock WHERE resource = p_resource FOR UPDATE;
    t_now := clock_timestamp();
    -- r.resource is NULL when there is no row.
    held := coalesce(r.holder = p_holder AND r.expires_at > t_now, false);
    IF leaving THEN
        PERFORM fencekit_lock_dequeue(p_resource, p_holder,
            CASE WHEN held OR r.expires_at IS NULL OR r.expires_at <= t_now THEN -2
                 ELSE fencekit_lock_ms(r.expires_at, t_now) END, t_now);
    END IF;
    IF NOT held THEN
        RETURN false;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM fencekit_lock_waiter WHERE resource = p_resource)
            OR fencekit_lock_hand_over(r, t_now, p_retention_ms) IS NULL THEN
        -- The queue is empty now (fencekit_lock_hand_over took out every
        -- lapsed entry): the flag goes too.
        UPDATE fencekit_lock SET holder = NULL, expires_at = NULL,
            retain_until = fencekit_lock_keep(r.token, t_now, p_retention_ms), waiting = false
        WHERE resource = p_resource;
    END IF;
    RETURN true;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- The functions of 00006, and the table without the flag.
DROP FUNCTION IF EXISTS fencekit_lock_release_full(text, text, bigint, boolean);
DROP FUNCTION IF EXISTS fencekit_lock_acquire_full(text, text, bigint, bigint, integer, boolean);
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencekit_lock_acquire(p_resource text, p_holder text, p_lease_ms bigint,
    p_retention_ms bigint, p_life_ms integer, ordered boolean,
    OUT kind integer, OUT token bigint, OUT remaining_ms bigint, OUT place integer, OUT ref bigint)
LANGUAGE plpgsql AS $$
DECLARE
    r fencekit_lock;
    t_now timestamptz;
    granted text;
    fresh boolean;
    my_id bigint;
    ahead bigint;
BEGIN
    -- The row, locked (fencekit_lock_row, written out: this is the hot path).
    LOOP
        SELECT * INTO r FROM fencekit_lock WHERE resource = p_resource FOR UPDATE;
        EXIT WHEN FOUND;
        INSERT INTO fencekit_lock (resource, token, retain_until)
        VALUES (p_resource, 0, clock_timestamp())
        ON CONFLICT (resource) DO NOTHING;
    END LOOP;
    t_now := clock_timestamp();
    IF r.holder IS NOT NULL AND r.expires_at > t_now THEN
        remaining_ms := fencekit_lock_ms(r.expires_at, t_now);
        IF r.holder = p_holder THEN
            PERFORM fencekit_lock_dequeue(p_resource, p_holder, remaining_ms, t_now);
            kind := 2;
            token := r.token;
            RETURN;
        END IF;
        kind := 0;
        SELECT e.place, e.ref INTO place, ref FROM fencekit_lock_enqueue(p_resource, p_holder, p_lease_ms, p_life_ms, t_now) e;
        RETURN;
    END IF;
    IF ordered OR p_life_ms IS NOT NULL THEN
        -- One look at the queue: the first entry of another waiter, and
        -- this caller's own.
        SELECT min(id) FILTER (WHERE waiter <> p_holder), min(id) FILTER (WHERE waiter = p_holder)
        INTO ahead, my_id FROM fencekit_lock_waiter WHERE resource = p_resource;
    END IF;
    IF ordered AND ahead < coalesce(my_id, 9223372036854775807) THEN
        granted := fencekit_lock_hand_over(r, t_now, p_retention_ms);
        SELECT * INTO r FROM fencekit_lock WHERE resource = p_resource;
        IF granted = p_holder THEN
            -- Every entry ahead had lapsed: the grant went to this caller.
            kind := 1;
            token := r.token;
            remaining_ms := p_lease_ms;
            RETURN;
        END IF;
        IF granted IS NOT NULL THEN
            kind := 0;
            remaining_ms := fencekit_lock_ms(r.expires_at, t_now);
            SELECT e.place, e.ref INTO place, ref FROM fencekit_lock_enqueue(p_resource, p_holder, p_lease_ms, p_life_ms, t_now) e;
            RETURN;
        END IF;
        -- Nobody ahead was live, and the lapsed entries (this caller's
        -- too, if it had lapsed) are gone.
        my_id := NULL;
    END IF;
    fresh := r.token = 0;
    -- fencekit_lock_next, written out.
    token := greatest(r.token + 1, fencekit_lock_us(t_now));
    IF token > 9007199254740991 THEN
        RAISE EXCEPTION 'token space exhausted: the next token would pass 2^53-1'
            USING ERRCODE = 'FK002';
    END IF;
    UPDATE fencekit_lock SET holder = p_holder, token = fencekit_lock_acquire.token,
        expires_at = t_now + p_lease_ms * interval '1 millisecond',
        retain_until = fencekit_lock_keep(fencekit_lock_acquire.token, t_now + p_lease_ms * interval '1 millisecond', p_retention_ms)
    WHERE resource = p_resource;
    IF my_id IS NOT NULL THEN
        PERFORM fencekit_lock_dequeue(p_resource, p_holder, p_lease_ms, t_now);
    END IF;
    kind := 1;
    remaining_ms := p_lease_ms;
    IF fresh THEN
        place := 1;
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencekit_lock_enqueue(p_resource text, p_holder text, p_lease_ms bigint,
    p_life_ms integer, t_now timestamptz, OUT place integer, OUT ref bigint)
LANGUAGE plpgsql AS $$
DECLARE
    my_id bigint;
BEGIN
    IF p_life_ms IS NULL THEN
        RETURN;
    END IF;
    INSERT INTO fencekit_lock_waiter AS w (resource, waiter, refreshed, life_ms, lease_ms)
    VALUES (p_resource, p_holder, t_now, p_life_ms, p_lease_ms)
    ON CONFLICT (resource, waiter) DO UPDATE
        SET refreshed = EXCLUDED.refreshed, life_ms = EXCLUDED.life_ms, lease_ms = EXCLUDED.lease_ms
    RETURNING w.id INTO my_id;
    place := (SELECT count(*) FROM fencekit_lock_waiter
        WHERE resource = p_resource AND id < my_id
          AND refreshed + fencekit_lock_waiter.life_ms * interval '1 millisecond' >= t_now);
    ref := fencekit_lock_us(t_now);
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencekit_lock_dequeue(p_resource text, p_holder text, remaining_ms bigint,
    t_now timestamptz) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    my_id bigint;
BEGIN
    DELETE FROM fencekit_lock_waiter WHERE resource = p_resource AND waiter = p_holder
    RETURNING id INTO my_id;
    -- Among the first three live entries: fewer than three live ones
    -- were ahead of it.
    IF FOUND AND (SELECT count(*) FROM fencekit_lock_waiter WHERE resource = p_resource AND id < my_id
            AND refreshed + life_ms * interval '1 millisecond' >= t_now) < 3 THEN
        PERFORM fencekit_lock_notify(p_resource, '-', 0, 0, 0, remaining_ms, t_now);
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencekit_lock_release(p_resource text, p_holder text, p_retention_ms bigint,
    leaving boolean) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    r fencekit_lock;
    t_now timestamptz;
    held boolean;
BEGIN
    SELECT * INTO r FROM fencekit_lock WHERE resource = p_resource FOR UPDATE;
    t_now := clock_timestamp();
    -- r.resource is NULL when there is no row.
    held := coalesce(r.holder = p_holder AND r.expires_at > t_now, false);
    IF leaving THEN
        PERFORM fencekit_lock_dequeue(p_resource, p_holder,
            CASE WHEN held OR r.expires_at IS NULL OR r.expires_at <= t_now THEN -2
                 ELSE fencekit_lock_ms(r.expires_at, t_now) END, t_now);
    END IF;
    IF NOT held THEN
        RETURN false;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM fencekit_lock_waiter WHERE resource = p_resource)
            OR fencekit_lock_hand_over(r, t_now, p_retention_ms) IS NULL THEN
        UPDATE fencekit_lock SET holder = NULL, expires_at = NULL,
            retain_until = fencekit_lock_keep(r.token, t_now, p_retention_ms)
        WHERE resource = p_resource;
    END IF;
    RETURN true;
END
$$;
-- +goose StatementEnd
ALTER TABLE fencekit_lock DROP COLUMN IF EXISTS waiting;
