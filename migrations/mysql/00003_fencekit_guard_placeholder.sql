-- +goose Up
-- storage/mysql creates a resource's guard row in a statement of its own,
-- committed before the transaction that guards it, so that guarding never
-- inserts a row inside a transaction (InnoDB turns a rolled-back insert's
-- waiters into gap-lock holders, which then deadlock). Such a row holds no
-- mark yet: token 0, an empty holder, no admissions. Every fence's token is
-- at least 1, so the row admits every fence, as a missing row does.
--
-- The checks of 00001 are dropped by whatever name the server gave them
-- (MariaDB: CONSTRAINT_1, MySQL: fencekit_guard_chk_1) and added again with
-- names of their own; running this again drops and adds the named ones.
SET @fencekit_drop = (
    SELECT COALESCE(CONCAT('ALTER TABLE fencekit_guard ',
               GROUP_CONCAT(CONCAT('DROP CONSTRAINT `', REPLACE(CONSTRAINT_NAME, '`', '``'), '`') SEPARATOR ', ')),
           'DO 0')
    FROM information_schema.TABLE_CONSTRAINTS
    WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'fencekit_guard' AND CONSTRAINT_TYPE = 'CHECK');
PREPARE fencekit_stmt FROM @fencekit_drop;
EXECUTE fencekit_stmt;
DEALLOCATE PREPARE fencekit_stmt;
ALTER TABLE fencekit_guard
    ADD CONSTRAINT fencekit_guard_token CHECK (token >= 0),
    ADD CONSTRAINT fencekit_guard_holder CHECK (holder <> '' OR token = 0);

-- +goose Down
DELETE FROM fencekit_guard WHERE token = 0;
ALTER TABLE fencekit_guard
    DROP CONSTRAINT fencekit_guard_token,
    DROP CONSTRAINT fencekit_guard_holder,
    ADD CHECK (token >= 1),
    ADD CHECK (holder <> '');
