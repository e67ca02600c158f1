-- +goose Up
-- fencekit_lock_grant takes a deadline on the server's clock (p_until_us),
-- past which it changes nothing and answers kind 3 (too late): a grant's
-- request held in the network until after its caller gave up, and after
-- that caller's cleanup could not reach the server, grants nothing when it
-- lands. The rest of the procedure is 00005's.
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
--   kind 3: too late: the server's clock, read once the row is locked, is
--     past p_until_us; nothing changed (no grant, no queue entry).
-- p_until_us is the grant's deadline on the server's clock (µs since the
-- epoch; NULL: none): a request that reaches the server after its caller
-- gave up, held in the network, grants nothing.
-- +goose StatementBegin
CREATE PROCEDURE fencekit_lock_grant(IN p_resource VARBINARY(1024), IN p_holder VARBINARY(255),
    IN p_lease_ms BIGINT, IN p_retention_ms BIGINT, IN p_life_ms INT, IN p_ordered BOOLEAN, IN p_bell BIGINT, IN p_until_us BIGINT)
proc: BEGIN
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
    IF t_now > p_until_us THEN
        ROLLBACK;
        SELECT 3, NULL, NULL, NULL, NULL;
        LEAVE proc;
    END IF;
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

-- +goose Down
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
