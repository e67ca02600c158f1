-- +goose Up
-- The MySQL lock (package lock/mysqllock): one row per active resource,
-- one row per queued waiter, and the procedures that grant, extend,
-- release and hand over, each called in one statement (CALL), each its own
-- transaction whatever the session's autocommit, each deciding on rows it
-- has locked (so at any isolation level), deciding
-- every lease on the server's clock (UTC_TIMESTAMP(6), in µs since the
-- epoch: no time zone enters).
--
-- Tokens are max(previous + 1, the server's clock in µs), the token space
-- of the Redis and PostgreSQL locks, so a resource moved from them is
-- admitted, and once a row is gone (reclaimed, or the table restored from
-- an older backup) the clock alone issues tokens above every earlier one.
-- waiting is set while the resource may have queue entries: a grant or a
-- release of a row without it is one UPDATE (package mysqllock's fast
-- path), and any other goes to the procedures, which keep it right.
--
-- A row is reclaimed only after retain_until_us, which is never before
-- the lease's end plus the retention, nor before the clock has passed the
-- row's counter.
--
-- Names and holders are VARBINARY: compared byte for byte. Bodies use no
-- double quotes, no || and no backslashes, so that they mean the same
-- whatever sql_mode created them (a routine keeps that sql_mode).
CREATE TABLE IF NOT EXISTS fencekit_lock (
    resource        VARBINARY(1024) NOT NULL,
    holder          VARBINARY(255)  NULL,
    token           BIGINT          NOT NULL,
    expires_us      BIGINT          NULL,
    retain_until_us BIGINT          NOT NULL,
    handed_ref      BIGINT          NULL,
    handed_us       BIGINT          NULL,
    record_value    MEDIUMBLOB      NULL,
    record_token    BIGINT          NULL,
    record_holder   VARBINARY(255)  NULL,
    record_seq      BIGINT          NOT NULL DEFAULT 0,
    waiting         BOOLEAN         NOT NULL DEFAULT FALSE,
    PRIMARY KEY (resource),
    KEY fencekit_lock_retain (retain_until_us)
) ENGINE = InnoDB ROW_FORMAT = DYNAMIC;

-- fencekit_lock_waiter is the wait queue, first come first served by id;
-- an entry lapses life_ms after its last refresh. bell is the connection
-- id of the waiter's doorbell: a session of the waiting process that
-- sleeps, and whose sleep the hand-over interrupts (KILL QUERY).
CREATE TABLE IF NOT EXISTS fencekit_lock_waiter (
    id           BIGINT          NOT NULL AUTO_INCREMENT,
    resource     VARBINARY(1024) NOT NULL,
    waiter       VARBINARY(255)  NOT NULL,
    refreshed_us BIGINT          NOT NULL,
    life_ms      INT             NOT NULL,
    lease_ms     BIGINT          NOT NULL,
    bell         BIGINT          NULL,
    PRIMARY KEY (id),
    UNIQUE KEY fencekit_lock_waiter_entry (resource, waiter),
    KEY fencekit_lock_waiter_order (resource, id)
) ENGINE = InnoDB ROW_FORMAT = DYNAMIC;

DROP PROCEDURE IF EXISTS fencekit_lock_row;
-- fencekit_lock_row locks resource's row, creating it (token 0: no token
-- issued since the row went) when there is none, and returns its state.
-- +goose StatementBegin
CREATE PROCEDURE fencekit_lock_row(IN p_resource VARBINARY(1024), OUT o_holder VARBINARY(255),
    OUT o_token BIGINT, OUT o_expires BIGINT, OUT o_found BOOLEAN)
BEGIN
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET o_found = FALSE;
    SET o_found = TRUE;
    SELECT holder, token, expires_us INTO o_holder, o_token, o_expires
    FROM fencekit_lock WHERE resource = p_resource FOR UPDATE;
    IF NOT o_found THEN
        INSERT INTO fencekit_lock (resource, token, retain_until_us) VALUES (p_resource, 0, 0)
        ON DUPLICATE KEY UPDATE token = token;
        SET o_found = TRUE;
        SELECT holder, token, expires_us INTO o_holder, o_token, o_expires
        FROM fencekit_lock WHERE resource = p_resource FOR UPDATE;
    END IF;
END
-- +goose StatementEnd

DROP PROCEDURE IF EXISTS fencekit_lock_hand_over;
-- fencekit_lock_hand_over grants the locked, free row of resource (counter
-- p_token) to the first live waiter of its queue, taking its entry out and
-- dropping the lapsed ones ahead of it. It returns the waiter granted and
-- its bell, or NULLs when none was live (every lapsed entry is then gone).
-- +goose StatementBegin
CREATE PROCEDURE fencekit_lock_hand_over(IN p_resource VARBINARY(1024), IN p_token BIGINT, IN t_now BIGINT,
    IN p_retention_ms BIGINT, OUT o_waiter VARBINARY(255), OUT o_bell BIGINT)
BEGIN
    DECLARE w_id, w_refreshed, w_lease, w_bell, t BIGINT;
    DECLARE w_life INT;
    DECLARE w_waiter VARBINARY(255);
    DECLARE done BOOLEAN DEFAULT FALSE;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET done = TRUE;
    SET o_waiter = NULL, o_bell = NULL;
    next_entry: LOOP
        SET done = FALSE;
        SELECT id, waiter, refreshed_us, life_ms, lease_ms, bell
        INTO w_id, w_waiter, w_refreshed, w_life, w_lease, w_bell
        FROM fencekit_lock_waiter WHERE resource = p_resource ORDER BY id LIMIT 1 FOR UPDATE;
        IF done THEN
            LEAVE next_entry;
        END IF;
        DELETE FROM fencekit_lock_waiter WHERE id = w_id;
        IF w_refreshed + w_life * 1000 >= t_now THEN
            SET t = GREATEST(p_token + 1, t_now);
            IF t > 9007199254740991 THEN
                SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'fencekit: token space exhausted, the next token would pass 2^53-1';
            END IF;
            UPDATE fencekit_lock SET holder = w_waiter, token = t, expires_us = t_now + w_lease * 1000,
                retain_until_us = GREATEST(t_now + w_lease * 1000, t) + p_retention_ms * 1000,
                handed_ref = w_refreshed, handed_us = t_now
            WHERE resource = p_resource;
            SET o_waiter = w_waiter, o_bell = w_bell;
            LEAVE next_entry;
        END IF;
    END LOOP;
END
-- +goose StatementEnd

DROP PROCEDURE IF EXISTS fencekit_lock_ring;
-- fencekit_lock_ring interrupts the sleep of a waiter's doorbell session,
-- after the transaction that handed it the lock committed. A bell that is
-- gone, or that this user may not interrupt, is passed over: the waiter
-- finds the grant by its next refresh.
-- +goose StatementBegin
CREATE PROCEDURE fencekit_lock_ring(IN p_bell BIGINT)
BEGIN
    DECLARE CONTINUE HANDLER FOR SQLEXCEPTION BEGIN END;
    IF p_bell IS NOT NULL AND p_bell <> CONNECTION_ID() THEN
        KILL QUERY p_bell;
    END IF;
END
-- +goose StatementEnd

DROP PROCEDURE IF EXISTS fencekit_lock_grant;
-- fencekit_lock_grant grants resource to holder for p_lease_ms, or refuses,
-- and answers one row (kind, token, remaining_ms, place, ref):
--   kind 1: granted now with a new token (place 1: the row was new, the
--     token came from the clock alone);
--   kind 2: already held by this holder (a retry whose reply was lost, or a
--     waiter the lock was handed to): its token and what is left;
--   kind 0: refused; remaining_ms is what is left of the current lease;
--     when the caller queued, place is its place among the live waiters (0
--     first) and ref names its entry as refreshed (µs); NULL otherwise.
-- p_life_ms NULL: the caller does not queue; otherwise a refused caller
-- queues (or refreshes its entry, keeping its place) with that life and
-- p_bell. p_ordered: a free lock with live waiters ahead of the caller goes
-- to the first of them (rung after the commit), and the caller is refused.
-- +goose StatementBegin
CREATE PROCEDURE fencekit_lock_grant(IN p_resource VARBINARY(1024), IN p_holder VARBINARY(255),
    IN p_lease_ms BIGINT, IN p_retention_ms BIGINT, IN p_life_ms INT, IN p_ordered BOOLEAN, IN p_bell BIGINT)
BEGIN
    DECLARE r_holder, granted VARBINARY(255);
    DECLARE r_token, r_expires, t_now, my_id, ahead, ring, k, tok, rem, pl, rf BIGINT;
    DECLARE found_row, fresh BOOLEAN;
    DECLARE missing BOOLEAN DEFAULT FALSE;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET missing = TRUE;
    START TRANSACTION;
    SELECT holder, token, expires_us INTO r_holder, r_token, r_expires
    FROM fencekit_lock WHERE resource = p_resource FOR UPDATE;
    IF missing THEN
        CALL fencekit_lock_row(p_resource, r_holder, r_token, r_expires, found_row);
    END IF;
    SET t_now = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6));
    decide: BEGIN
        IF r_holder IS NOT NULL AND r_expires > t_now THEN
            SET rem = (r_expires - t_now) DIV 1000;
            IF r_holder = p_holder THEN
                DELETE FROM fencekit_lock_waiter WHERE resource = p_resource AND waiter = p_holder;
                SET k = 2, tok = r_token;
            ELSE
                SET k = 0;
            END IF;
            LEAVE decide;
        END IF;
        IF p_ordered OR p_life_ms IS NOT NULL THEN
            SELECT MIN(CASE WHEN waiter <> p_holder THEN id END), MIN(CASE WHEN waiter = p_holder THEN id END)
            INTO ahead, my_id FROM fencekit_lock_waiter WHERE resource = p_resource;
        END IF;
        IF p_ordered AND ahead < COALESCE(my_id, 9223372036854775807) THEN
            CALL fencekit_lock_hand_over(p_resource, r_token, t_now, p_retention_ms, granted, ring);
            IF granted = p_holder THEN
                -- Every entry ahead had lapsed: the grant went to this caller.
                SET ring = NULL, k = 1, rem = p_lease_ms;
                SELECT token INTO tok FROM fencekit_lock WHERE resource = p_resource;
                UPDATE fencekit_lock SET handed_ref = NULL, handed_us = NULL WHERE resource = p_resource;
                LEAVE decide;
            END IF;
            IF granted IS NOT NULL THEN
                SET k = 0;
                SELECT (expires_us - t_now) DIV 1000 INTO rem FROM fencekit_lock WHERE resource = p_resource;
                LEAVE decide;
            END IF;
            SET my_id = NULL;
        END IF;
        SET fresh = (r_token = 0);
        SET tok = GREATEST(r_token + 1, t_now);
        IF tok > 9007199254740991 THEN
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'fencekit: token space exhausted, the next token would pass 2^53-1';
        END IF;
        UPDATE fencekit_lock SET holder = p_holder, token = tok, expires_us = t_now + p_lease_ms * 1000,
            retain_until_us = GREATEST(t_now + p_lease_ms * 1000, tok) + p_retention_ms * 1000,
            handed_ref = NULL, handed_us = NULL
        WHERE resource = p_resource;
        IF my_id IS NOT NULL THEN
            DELETE FROM fencekit_lock_waiter WHERE id = my_id;
        END IF;
        SET k = 1, rem = p_lease_ms;
        IF fresh THEN
            SET pl = 1;
        END IF;
    END decide;
    IF k = 0 AND p_life_ms IS NOT NULL THEN
        INSERT INTO fencekit_lock_waiter (resource, waiter, refreshed_us, life_ms, lease_ms, bell)
        VALUES (p_resource, p_holder, t_now, p_life_ms, p_lease_ms, p_bell)
        ON DUPLICATE KEY UPDATE refreshed_us = VALUES(refreshed_us), life_ms = VALUES(life_ms),
            lease_ms = VALUES(lease_ms), bell = VALUES(bell);
        SELECT COUNT(*) INTO pl FROM fencekit_lock_waiter w, fencekit_lock_waiter me
        WHERE me.resource = p_resource AND me.waiter = p_holder AND w.resource = p_resource
          AND w.id < me.id AND w.refreshed_us + w.life_ms * 1000 >= t_now;
        SET rf = t_now;
    END IF;
    UPDATE fencekit_lock SET waiting = EXISTS (SELECT 1 FROM fencekit_lock_waiter WHERE resource = p_resource)
    WHERE resource = p_resource;
    COMMIT;
    IF ring IS NOT NULL THEN
        CALL fencekit_lock_ring(ring);
    END IF;
    SELECT k, tok, rem, pl, rf;
END
-- +goose StatementEnd

DROP PROCEDURE IF EXISTS fencekit_lock_release;
-- fencekit_lock_release frees resource if holder still holds it and, in
-- the same transaction, hands it to the first live waiter (rung after the
-- commit). It answers one row: 1 if released, 0 if holder did not hold it
-- (a retried release finds it gone). p_leaving: the holder is a waiter
-- giving up: its queue entry goes too.
-- +goose StatementBegin
CREATE PROCEDURE fencekit_lock_release(IN p_resource VARBINARY(1024), IN p_holder VARBINARY(255),
    IN p_retention_ms BIGINT, IN p_leaving BOOLEAN)
BEGIN
    DECLARE r_holder, granted VARBINARY(255);
    DECLARE r_token, r_expires, t_now, ring BIGINT;
    DECLARE held BOOLEAN DEFAULT FALSE;
    DECLARE done BOOLEAN DEFAULT FALSE;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET done = TRUE;
    BEGIN
        DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
        START TRANSACTION;
        SELECT holder, token, expires_us INTO r_holder, r_token, r_expires
        FROM fencekit_lock WHERE resource = p_resource FOR UPDATE;
        SET t_now = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6));
        IF p_leaving THEN
            DELETE FROM fencekit_lock_waiter WHERE resource = p_resource AND waiter = p_holder;
        END IF;
        SET held = COALESCE(NOT done AND r_holder = p_holder AND r_expires > t_now, FALSE);
        IF held THEN
            CALL fencekit_lock_hand_over(p_resource, r_token, t_now, p_retention_ms, granted, ring);
            IF granted IS NULL THEN
                UPDATE fencekit_lock SET holder = NULL, expires_us = NULL, handed_ref = NULL, handed_us = NULL,
                    retain_until_us = GREATEST(t_now, r_token) + p_retention_ms * 1000
                WHERE resource = p_resource;
            END IF;
        END IF;
        IF NOT done THEN
            UPDATE fencekit_lock SET waiting = EXISTS (SELECT 1 FROM fencekit_lock_waiter WHERE resource = p_resource)
            WHERE resource = p_resource;
        END IF;
        COMMIT;
    END;
    IF ring IS NOT NULL THEN
        CALL fencekit_lock_ring(ring);
    END IF;
    SELECT held;
END
-- +goose StatementEnd

DROP PROCEDURE IF EXISTS fencekit_lock_extend;
-- fencekit_lock_extend lengthens holder's lease to at least p_lease_ms from
-- now, never shortening it, and answers what is left of it in ms, or -3
-- when holder does not hold it (nothing changed).
-- +goose StatementBegin
CREATE PROCEDURE fencekit_lock_extend(IN p_resource VARBINARY(1024), IN p_holder VARBINARY(255),
    IN p_lease_ms BIGINT, IN p_retention_ms BIGINT)
BEGIN
    DECLARE r_token, r_expires, t_now, rem BIGINT;
    DECLARE done BOOLEAN DEFAULT FALSE;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET done = TRUE;
    BEGIN
        DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
        START TRANSACTION;
        SELECT token, expires_us INTO r_token, r_expires
        FROM fencekit_lock WHERE resource = p_resource AND holder = p_holder FOR UPDATE;
        SET t_now = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6));
        IF done OR r_expires <= t_now THEN
            SET rem = -3;
        ELSE
            SET r_expires = GREATEST(r_expires, t_now + p_lease_ms * 1000);
            UPDATE fencekit_lock SET expires_us = r_expires,
                retain_until_us = GREATEST(retain_until_us, GREATEST(r_expires, r_token) + p_retention_ms * 1000)
            WHERE resource = p_resource;
            SET rem = (r_expires - t_now) DIV 1000;
        END IF;
        COMMIT;
    END;
    SELECT rem;
END
-- +goose StatementEnd

DROP PROCEDURE IF EXISTS fencekit_lock_ttl;
-- fencekit_lock_ttl answers what is left in ms of holder's lease, or -3
-- when holder does not hold it. Reads only, the newest committed state.
-- +goose StatementBegin
CREATE PROCEDURE fencekit_lock_ttl(IN p_resource VARBINARY(1024), IN p_holder VARBINARY(255))
BEGIN
    DECLARE t_now, r_expires BIGINT;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    START TRANSACTION;
    SET t_now = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6));
    SELECT MAX(expires_us) INTO r_expires FROM fencekit_lock WHERE resource = p_resource AND holder = p_holder
    LOCK IN SHARE MODE;
    COMMIT;
    SELECT CASE WHEN r_expires > t_now THEN (r_expires - t_now) DIV 1000 ELSE -3 END;
END
-- +goose StatementEnd

DROP PROCEDURE IF EXISTS fencekit_lock_set_record;
-- fencekit_lock_set_record writes the record beside resource's lock, only
-- for the grant (holder, token) that holds it, and keeps it at least
-- p_linger_ms past the lease. Answers 1 when written (or already this
-- grant's with this value), 0 when the grant does not hold the lock, minus
-- the record's token when it names a newer grant (nothing written).
-- +goose StatementBegin
CREATE PROCEDURE fencekit_lock_set_record(IN p_resource VARBINARY(1024), IN p_holder VARBINARY(255),
    IN p_token BIGINT, IN p_value MEDIUMBLOB, IN p_linger_ms BIGINT)
BEGIN
    DECLARE r_holder, rec_holder VARBINARY(255);
    DECLARE r_token, r_expires, rec_token, t_now, res BIGINT;
    DECLARE rec_value MEDIUMBLOB;
    DECLARE done BOOLEAN DEFAULT FALSE;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET done = TRUE;
    BEGIN
        DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
        START TRANSACTION;
        SELECT holder, token, expires_us, record_token, record_holder, record_value
        INTO r_holder, r_token, r_expires, rec_token, rec_holder, rec_value
        FROM fencekit_lock WHERE resource = p_resource FOR UPDATE;
        SET t_now = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6));
        IF done OR NOT (r_holder <=> p_holder) OR r_token <> p_token OR r_expires <= t_now THEN
            SET res = 0;
        ELSEIF rec_token > p_token OR (rec_token = p_token AND rec_holder <> p_holder) THEN
            SET res = -rec_token;
        ELSE
            IF NOT (rec_token <=> p_token) OR NOT (rec_value <=> p_value) THEN
                UPDATE fencekit_lock SET record_value = p_value, record_token = p_token, record_holder = p_holder,
                    record_seq = 0, retain_until_us = GREATEST(retain_until_us, r_expires + p_linger_ms * 1000)
                WHERE resource = p_resource;
            ELSE
                UPDATE fencekit_lock SET retain_until_us = GREATEST(retain_until_us, r_expires + p_linger_ms * 1000)
                WHERE resource = p_resource;
            END IF;
            SET res = 1;
        END IF;
        COMMIT;
    END;
    SELECT res;
END
-- +goose StatementEnd

DROP PROCEDURE IF EXISTS fencekit_lock_keep_record;
-- fencekit_lock_keep_record keeps the record of the grant (holder, token)
-- at least p_linger_ms past its lease; 1 when kept, 0 when the lock or
-- the record is no longer that grant's.
-- +goose StatementBegin
CREATE PROCEDURE fencekit_lock_keep_record(IN p_resource VARBINARY(1024), IN p_holder VARBINARY(255),
    IN p_token BIGINT, IN p_linger_ms BIGINT)
BEGIN
    DECLARE n BIGINT;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    START TRANSACTION;
    SELECT COUNT(*) INTO n FROM fencekit_lock
    WHERE resource = p_resource AND holder = p_holder AND token = p_token AND record_token = p_token
      AND record_holder = p_holder
      AND expires_us > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))
    FOR UPDATE;
    IF n > 0 THEN
        UPDATE fencekit_lock SET retain_until_us = GREATEST(retain_until_us, expires_us + p_linger_ms * 1000)
        WHERE resource = p_resource;
    END IF;
    COMMIT;
    SELECT n > 0;
END
-- +goose StatementEnd

DROP PROCEDURE IF EXISTS fencekit_lock_proclaim;
-- fencekit_lock_proclaim makes p_value the record's value while the grant
-- (holder, token) holds the lock and the record is its own, counting up
-- record_seq when the value changes. Answers 1 when the record holds
-- p_value, 0 when the lock or the record is no longer that grant's.
-- +goose StatementBegin
CREATE PROCEDURE fencekit_lock_proclaim(IN p_resource VARBINARY(1024), IN p_holder VARBINARY(255),
    IN p_token BIGINT, IN p_value MEDIUMBLOB)
BEGIN
    DECLARE ok BOOLEAN DEFAULT FALSE;
    DECLARE rec_value MEDIUMBLOB;
    DECLARE done BOOLEAN DEFAULT FALSE;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET done = TRUE;
    BEGIN
        DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
        START TRANSACTION;
        SELECT record_value INTO rec_value FROM fencekit_lock
        WHERE resource = p_resource AND holder = p_holder AND token = p_token AND record_token = p_token
          AND record_holder = p_holder
          AND expires_us > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))
        FOR UPDATE;
        IF NOT done THEN
            SET ok = TRUE;
            IF NOT (rec_value <=> p_value) THEN
                UPDATE fencekit_lock SET record_value = p_value, record_seq = record_seq + 1
                WHERE resource = p_resource;
            END IF;
        END IF;
        COMMIT;
    END;
    SELECT ok;
END
-- +goose StatementEnd

DROP PROCEDURE IF EXISTS fencekit_lock_record;
-- fencekit_lock_record answers the record beside resource's lock (value,
-- token, holder, seq) while the grant that wrote it holds the lock; no row
-- otherwise. Reads only, the newest committed state.
-- +goose StatementBegin
CREATE PROCEDURE fencekit_lock_record(IN p_resource VARBINARY(1024))
BEGIN
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    START TRANSACTION;
    SELECT record_value, record_token, record_holder, record_seq FROM fencekit_lock
    WHERE resource = p_resource AND holder = record_holder AND token = record_token
      AND expires_us > TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))
    LOCK IN SHARE MODE;
    COMMIT;
END
-- +goose StatementEnd

DROP PROCEDURE IF EXISTS fencekit_lock_advance;
-- fencekit_lock_advance raises resource's counter to at least p_token,
-- never lowering it, and keeps the row until the clock has passed it.
-- +goose StatementBegin
CREATE PROCEDURE fencekit_lock_advance(IN p_resource VARBINARY(1024), IN p_token BIGINT, IN p_retention_ms BIGINT)
BEGIN
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    START TRANSACTION;
    INSERT INTO fencekit_lock (resource, token, retain_until_us) VALUES (p_resource, p_token, p_token + p_retention_ms * 1000)
    ON DUPLICATE KEY UPDATE token = GREATEST(token, VALUES(token)),
        retain_until_us = GREATEST(retain_until_us, VALUES(retain_until_us));
    COMMIT;
    SELECT 1;
END
-- +goose StatementEnd

DROP PROCEDURE IF EXISTS fencekit_lock_reclaim;
-- fencekit_lock_reclaim deletes up to p_max rows of idle resources past
-- their retention, and lapsed queue entries; answers how many rows went.
-- +goose StatementBegin
CREATE PROCEDURE fencekit_lock_reclaim(IN p_max INT)
BEGIN
    DECLARE t_now, n BIGINT;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    START TRANSACTION;
    SET t_now = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6));
    DELETE FROM fencekit_lock WHERE retain_until_us < t_now AND (holder IS NULL OR expires_us <= t_now)
    LIMIT p_max;
    SET n = ROW_COUNT();
    DELETE FROM fencekit_lock_waiter WHERE refreshed_us + life_ms * 1000 < t_now - 60000000 LIMIT p_max;
    COMMIT;
    SELECT n;
END
-- +goose StatementEnd

-- +goose Down
DROP PROCEDURE IF EXISTS fencekit_lock_reclaim;
DROP PROCEDURE IF EXISTS fencekit_lock_advance;
DROP PROCEDURE IF EXISTS fencekit_lock_record;
DROP PROCEDURE IF EXISTS fencekit_lock_proclaim;
DROP PROCEDURE IF EXISTS fencekit_lock_keep_record;
DROP PROCEDURE IF EXISTS fencekit_lock_set_record;
DROP PROCEDURE IF EXISTS fencekit_lock_ttl;
DROP PROCEDURE IF EXISTS fencekit_lock_extend;
DROP PROCEDURE IF EXISTS fencekit_lock_release;
DROP PROCEDURE IF EXISTS fencekit_lock_grant;
DROP PROCEDURE IF EXISTS fencekit_lock_ring;
DROP PROCEDURE IF EXISTS fencekit_lock_hand_over;
DROP PROCEDURE IF EXISTS fencekit_lock_row;
DROP TABLE IF EXISTS fencekit_lock_waiter;
DROP TABLE IF EXISTS fencekit_lock;
