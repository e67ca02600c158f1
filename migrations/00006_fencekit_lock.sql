-- +goose Up
-- The PostgreSQL lock (package lock/pglock): one row per active resource,
-- one row per queued waiter, and the functions that grant, extend, release
-- and hand over in one statement each.
--
-- Both tables are UNLOGGED: a grant or a release writes no WAL and waits
-- for no flush, and a crash or a failover to a standby empties them, as a
-- Redis restart without persistence empties the Redis lock's keys. Tokens
-- need no durable state for that: each is max(previous + 1, the server's
-- clock in microseconds), so once a row is gone the clock alone issues
-- tokens above every earlier one, in the token space of the Redis lock.
-- docs/guarantees.md says what holds after a crash and after a failover.
--
-- fencekit_lock: holder and expires_at are NULL while the lock is free;
-- token is the newest token issued for the resource (the counter); the row
-- may be reclaimed once retain_until has passed, which is never before
-- the lease's end plus the retention, nor before the clock has passed the
-- counter by the retention. record_* is the record kept beside the lock
-- (the election's leader), written only by the holder.
CREATE UNLOGGED TABLE IF NOT EXISTS fencekit_lock (
    resource      text PRIMARY KEY,
    holder        text,
    token         bigint NOT NULL,
    expires_at    timestamptz,
    retain_until  timestamptz NOT NULL,
    record_value  text,
    record_token  bigint,
    record_holder text
);

-- fencekit_lock_waiter: the wait queue, first come first served by id;
-- an entry lapses life_ms after its last refresh.
CREATE UNLOGGED TABLE IF NOT EXISTS fencekit_lock_waiter (
    resource  text NOT NULL,
    waiter    text NOT NULL,
    id        bigint GENERATED ALWAYS AS IDENTITY,
    refreshed timestamptz NOT NULL,
    life_ms   integer NOT NULL,
    lease_ms  bigint  NOT NULL,
    PRIMARY KEY (resource, waiter)
);
CREATE INDEX IF NOT EXISTS fencekit_lock_waiter_order ON fencekit_lock_waiter (resource, id);

-- fencekit_lock_mark is what a notification says of a holder or a waiter:
-- enough to recognise one's own id, nothing that would let a listener
-- release or extend the lock.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencekit_lock_mark(id text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT substr(md5(id), 1, 16)
$$;
-- +goose StatementEnd

-- fencekit_lock_row locks the row of resource, creating it (token 0: no
-- token issued since the row was reclaimed) when there is none, and
-- returns it. A row reclaimed between the two steps is created again.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencekit_lock_row(p_resource text) RETURNS fencekit_lock
LANGUAGE plpgsql AS $$
DECLARE
    r fencekit_lock;
BEGIN
    LOOP
        SELECT * INTO r FROM fencekit_lock WHERE resource = p_resource FOR UPDATE;
        IF FOUND THEN
            RETURN r;
        END IF;
        INSERT INTO fencekit_lock (resource, token, retain_until)
        VALUES (p_resource, 0, clock_timestamp())
        ON CONFLICT (resource) DO NOTHING;
    END LOOP;
END
$$;
-- +goose StatementEnd

-- fencekit_lock_next is the token after n at clock t_now: max(n + 1, t_now in
-- microseconds). It raises SQLSTATE FK002 past 2^53 - 1, the largest token
-- every store keeps exactly.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencekit_lock_next(n bigint, t_now timestamptz) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    t bigint := greatest(n + 1, floor(extract(epoch FROM t_now) * 1000000)::bigint);
BEGIN
    IF t > 9007199254740991 THEN
        RAISE EXCEPTION 'token space exhausted: the next token would pass 2^53-1'
            USING ERRCODE = 'FK002';
    END IF;
    RETURN t;
END
$$;
-- +goose StatementEnd

-- fencekit_lock_keep is how long a row with counter n must outlive a lease
-- ending at lease_end: the retention, and however far n runs ahead of the
-- clock, so that once the row is gone the clock has passed every token.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencekit_lock_keep(n bigint, lease_end timestamptz, retention_ms bigint) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT greatest(lease_end, to_timestamp(n / 1000000.0)) + retention_ms * interval '1 millisecond'
$$;
-- +goose StatementEnd

-- fencekit_lock_heads names the first three live waiters of resource by
-- their marks, separated by spaces, '-' for each place nobody holds.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencekit_lock_heads(p_resource text, t_now timestamptz) RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    m text[];
BEGIN
    m := array(SELECT fencekit_lock_mark(waiter) FROM fencekit_lock_waiter
        WHERE resource = p_resource AND refreshed + life_ms * interval '1 millisecond' >= t_now
        ORDER BY id LIMIT 3);
    RETURN concat_ws(' ', coalesce(m[1], '-'), coalesce(m[2], '-'), coalesce(m[3], '-'));
END
$$;
-- +goose StatementEnd

-- fencekit_lock_notify tells the waiters of resource what changed, on the
-- channel fencekit_lock, in one payload of nine words:
--   "<resource mark> <granted> <token> <ref> <age ms> <remaining ms> <first> <second> <third>"
-- granted is the mark of the waiter just handed the lock ('-' for none),
-- with its token, the entry it was granted on (ref: the entry's last
-- refresh, in µs) and how long after that refresh the grant was made;
-- remaining is what is left of the current lease (-2: the lock is free);
-- then the marks of the first three live waiters ('-' for none).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencekit_lock_notify(p_resource text, granted text, token bigint, ref bigint,
    age_ms bigint, remaining_ms bigint, t_now timestamptz) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('fencekit_lock', concat_ws(' ', fencekit_lock_mark(p_resource), granted, token, ref,
        age_ms, remaining_ms, fencekit_lock_heads(p_resource, t_now)));
END
$$;
-- +goose StatementEnd

-- fencekit_lock_us is t in microseconds since the epoch.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencekit_lock_us(t timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT floor(extract(epoch FROM t) * 1000000)::bigint
$$;
-- +goose StatementEnd

-- fencekit_lock_ms is what is left of a lease ending at until, in ms.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencekit_lock_ms(until timestamptz, t_now timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT greatest(0, floor(extract(epoch FROM until - t_now) * 1000))::bigint
$$;
-- +goose StatementEnd

-- fencekit_lock_hand_over grants the locked row r, free, to the first live
-- waiter of its queue, taking that waiter's entry out and dropping the
-- lapsed ones ahead of it, and notifies the grant. It returns the waiter
-- granted, or NULL when none was live (then every lapsed entry is gone,
-- and, if there was any, the waiters are told the lock is free).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencekit_lock_hand_over(r fencekit_lock, t_now timestamptz, p_retention_ms bigint) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    w fencekit_lock_waiter;
    t bigint;
    seen boolean := false;
BEGIN
    FOR w IN SELECT * FROM fencekit_lock_waiter WHERE resource = r.resource ORDER BY id LOOP
        DELETE FROM fencekit_lock_waiter WHERE resource = r.resource AND waiter = w.waiter;
        IF w.refreshed + w.life_ms * interval '1 millisecond' >= t_now THEN
            t := fencekit_lock_next(r.token, t_now);
            UPDATE fencekit_lock SET holder = w.waiter, token = t,
                expires_at = t_now + w.lease_ms * interval '1 millisecond',
                retain_until = fencekit_lock_keep(t, t_now + w.lease_ms * interval '1 millisecond', p_retention_ms)
            WHERE resource = r.resource;
            PERFORM fencekit_lock_notify(r.resource, fencekit_lock_mark(w.waiter), t, fencekit_lock_us(w.refreshed),
                greatest(0, floor(extract(epoch FROM t_now - w.refreshed) * 1000))::bigint, w.lease_ms, t_now);
            RETURN w.waiter;
        END IF;
        seen := true;
    END LOOP;
    IF seen THEN
        -- Waiters were queued, none live: the lock is free for whoever tries.
        PERFORM fencekit_lock_notify(r.resource, '-', 0, 0, 0, -2, t_now);
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- fencekit_lock_acquire grants resource to holder for lease_ms, or refuses.
-- It answers (kind, token, remaining_ms, place, ref):
--   kind 1: granted now, token the new one (place 1 when the row was new or
--     reclaimed: the token came from the clock alone);
--   kind 2: already held by this holder (a retried grant whose reply was
--     lost, or a waiter the lock was handed to): its token and what is left
--     of its lease;
--   kind 0: refused; remaining_ms is what is left of the current lease;
--     when the caller queued, place is its place among the live waiters (0
--     first) and ref names its entry as refreshed (µs); NULL otherwise.
-- life_ms NULL: the caller does not queue; otherwise a refused caller
-- queues (or refreshes its entry, keeping its place) with that life.
-- ordered: the caller respects the queue: a free lock with live waiters
-- ahead of the caller goes to the first of them, and the caller is refused.
-- A caller that leaves the queue by a grant while among its first three
-- tells the waiters now first. Every check comes before the first write:
-- a refused call changes nothing but its own queue entry (and, when it
-- found the lock free, the hand-over to the waiter ahead of it).
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

-- fencekit_lock_enqueue queues holder for resource (or refreshes its entry,
-- keeping its place) when life_ms is not NULL, and returns its place (0
-- first among the live entries) and its entry's refresh in µs; NULLs when
-- it does not queue.
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

-- fencekit_lock_dequeue takes holder's entry out of resource's queue, if it
-- has one, and when it was among the first three live waiters tells the
-- waiters now first where they stand (remaining_ms: what is left of the
-- current lease, -2 when the lock is free).
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

-- fencekit_lock_release frees resource if holder still holds it and, in
-- the same statement, hands it to the first live waiter. It returns true
-- if released, false if holder did not hold it (a retried release finds
-- it gone). leaving: the holder is a waiter giving up: its queue entry
-- goes too, and when it was among the first three the waiters now first
-- are told where they stand.
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

-- fencekit_lock_ttl is what is left in ms of holder's lease of resource, or
-- -3 when holder does not hold it. Reads only.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencekit_lock_ttl(p_resource text, p_holder text) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    t_now timestamptz := clock_timestamp();
    until timestamptz;
BEGIN
    SELECT expires_at INTO until FROM fencekit_lock
    WHERE resource = p_resource AND holder = p_holder AND expires_at > t_now;
    IF NOT FOUND THEN
        RETURN -3;
    END IF;
    RETURN fencekit_lock_ms(until, t_now);
END
$$;
-- +goose StatementEnd

-- fencekit_lock_extend lengthens holder's lease to at least lease_ms from
-- t_now, never shortening it, and returns what is left of it in ms, or -3
-- when holder does not hold resource. Running it twice gives the same
-- result.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencekit_lock_extend(p_resource text, p_holder text, p_lease_ms bigint,
    p_retention_ms bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    r fencekit_lock;
    t_now timestamptz;
    until timestamptz;
BEGIN
    SELECT * INTO r FROM fencekit_lock WHERE resource = p_resource FOR UPDATE;
    t_now := clock_timestamp();
    IF NOT FOUND OR r.holder IS DISTINCT FROM p_holder OR r.expires_at <= t_now THEN
        RETURN -3;
    END IF;
    until := greatest(r.expires_at, t_now + p_lease_ms * interval '1 millisecond');
    IF until > r.expires_at THEN
        UPDATE fencekit_lock SET expires_at = until,
            retain_until = fencekit_lock_keep(r.token, until, p_retention_ms)
        WHERE resource = p_resource;
    END IF;
    RETURN floor(extract(epoch FROM until - t_now) * 1000)::bigint;
END
$$;
-- +goose StatementEnd

-- fencekit_lock_set_record writes the record beside resource's lock: only
-- while holder holds it with token, and never over a record of a newer
-- token. The row is kept at least linger_ms past the lease. It returns 1
-- when the record names this grant (written now, or by an earlier run that
-- a retry repeats), 0 when holder no longer holds the lock, and minus the
-- record's token when the record names a newer token. A write announces
-- the record on the channel fencekit_lock_record:
-- "<resource mark> <token> <value>" (without the value past 7000 bytes).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencekit_lock_set_record(p_resource text, p_holder text, p_token bigint,
    p_value text, p_linger_ms bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    r fencekit_lock;
BEGIN
    SELECT * INTO r FROM fencekit_lock WHERE resource = p_resource FOR UPDATE;
    IF NOT FOUND OR r.holder IS DISTINCT FROM p_holder OR r.token <> p_token
            OR r.expires_at <= clock_timestamp() THEN
        RETURN 0;
    END IF;
    IF r.record_token > p_token OR (r.record_token = p_token AND r.record_holder <> p_holder) THEN
        RETURN -r.record_token;
    END IF;
    UPDATE fencekit_lock SET record_value = p_value, record_token = p_token, record_holder = p_holder,
        retain_until = greatest(retain_until, expires_at + p_linger_ms * interval '1 millisecond')
    WHERE resource = p_resource;
    IF r.record_token IS DISTINCT FROM p_token OR r.record_value IS DISTINCT FROM p_value THEN
        -- A value too long for a notification's payload (8000 bytes) is
        -- announced by its token alone: watchers read it.
        PERFORM pg_notify('fencekit_lock_record', fencekit_lock_mark(p_resource) || ' ' || p_token
            || CASE WHEN octet_length(p_value) <= 7000 THEN ' ' || p_value ELSE '' END);
    END IF;
    RETURN 1;
END
$$;
-- +goose StatementEnd

-- fencekit_lock_keep_record keeps the record of holder's grant with token
-- at least linger_ms past its lease; it returns false when the lock or the
-- record is no longer that grant's.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencekit_lock_keep_record(p_resource text, p_holder text, p_token bigint,
    p_linger_ms bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE fencekit_lock SET retain_until = greatest(retain_until, expires_at + p_linger_ms * interval '1 millisecond')
    WHERE resource = p_resource AND holder = p_holder AND token = p_token AND record_holder = p_holder
      AND record_token = p_token AND expires_at > clock_timestamp();
    RETURN FOUND;
END
$$;
-- +goose StatementEnd

-- fencekit_lock_advance raises resource's counter to at least p_token,
-- never lowering it, so that the next grant's token is above it; the row
-- is kept until the clock has passed the counter.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencekit_lock_advance(p_resource text, p_token bigint, p_retention_ms bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    r fencekit_lock;
BEGIN
    r := fencekit_lock_row(p_resource);
    IF r.token < p_token THEN
        UPDATE fencekit_lock SET token = p_token,
            retain_until = greatest(retain_until, fencekit_lock_keep(p_token, coalesce(expires_at, clock_timestamp()), p_retention_ms))
        WHERE resource = p_resource;
        RETURN p_token;
    END IF;
    RETURN r.token;
END
$$;
-- +goose StatementEnd

-- fencekit_lock_record reads the record beside resource's lock, only while
-- the grant that wrote it still holds the lock: no row otherwise.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencekit_lock_record(p_resource text,
    OUT value text, OUT token bigint, OUT holder text)
RETURNS SETOF record
LANGUAGE sql STABLE AS $$
    SELECT record_value, record_token, record_holder FROM fencekit_lock
    WHERE resource = p_resource AND holder = record_holder AND token = record_token
      AND expires_at > clock_timestamp()
$$;
-- +goose StatementEnd

-- fencekit_lock_reclaim deletes up to max_rows rows of idle resources
-- whose retention has passed (the clock has passed their tokens by then,
-- so no token goes back) and lapsed queue entries, and returns how many
-- lock rows went. A row with a live waiter is kept.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fencekit_lock_reclaim(max_rows integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    DELETE FROM fencekit_lock_waiter WHERE ctid IN (
        SELECT ctid FROM fencekit_lock_waiter
        WHERE refreshed + life_ms * interval '1 millisecond' < clock_timestamp()
        LIMIT max_rows FOR UPDATE SKIP LOCKED);
    DELETE FROM fencekit_lock WHERE resource IN (
        SELECT l.resource FROM fencekit_lock l
        WHERE l.retain_until < clock_timestamp()
          AND NOT EXISTS (SELECT 1 FROM fencekit_lock_waiter w WHERE w.resource = l.resource)
        LIMIT max_rows FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION IF EXISTS fencekit_lock_reclaim(integer);
DROP FUNCTION IF EXISTS fencekit_lock_record(text);
DROP FUNCTION IF EXISTS fencekit_lock_advance(text, bigint, bigint);
DROP FUNCTION IF EXISTS fencekit_lock_keep_record(text, text, bigint, bigint);
DROP FUNCTION IF EXISTS fencekit_lock_set_record(text, text, bigint, text, bigint);
DROP FUNCTION IF EXISTS fencekit_lock_extend(text, text, bigint, bigint);
DROP FUNCTION IF EXISTS fencekit_lock_ttl(text, text);
DROP FUNCTION IF EXISTS fencekit_lock_release(text, text, bigint, boolean);
DROP FUNCTION IF EXISTS fencekit_lock_acquire(text, text, bigint, bigint, integer, boolean);
DROP FUNCTION IF EXISTS fencekit_lock_dequeue(text, text, bigint, timestamptz);
DROP FUNCTION IF EXISTS fencekit_lock_enqueue(text, text, bigint, integer, timestamptz);
DROP FUNCTION IF EXISTS fencekit_lock_hand_over(fencekit_lock, timestamptz, bigint);
DROP FUNCTION IF EXISTS fencekit_lock_ms(timestamptz, timestamptz);
DROP FUNCTION IF EXISTS fencekit_lock_us(timestamptz);
DROP FUNCTION IF EXISTS fencekit_lock_notify(text, text, bigint, bigint, bigint, bigint, timestamptz);
DROP FUNCTION IF EXISTS fencekit_lock_heads(text, timestamptz);
DROP FUNCTION IF EXISTS fencekit_lock_keep(bigint, timestamptz, bigint);
DROP FUNCTION IF EXISTS fencekit_lock_next(bigint, timestamptz);
DROP FUNCTION IF EXISTS fencekit_lock_row(text);
DROP FUNCTION IF EXISTS fencekit_lock_mark(text);
DROP TABLE IF EXISTS fencekit_lock_waiter;
DROP TABLE IF EXISTS fencekit_lock;
