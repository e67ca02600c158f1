-- +goose Up
-- The guard table keeps one high-water mark per resource: the newest fence
-- (token, holder) that storage/mysql admitted for it. Rows are only ever
-- raised, never lowered or deleted by fencekit.
--
-- resource and holder are VARBINARY: they hold the UTF-8 bytes of the names
-- and compare byte for byte, so "A" and "a", and "a" and "a ", are different
-- resources. (utf8mb4_bin would tell case apart but pads trailing spaces, and
-- 1024 utf8mb4 characters would not fit InnoDB's 3072-byte index key.)
-- admissions grows with every admission, so that an admission always changes
-- the row and the affected-rows count tells it from a refusal whatever the
-- client's found-rows flag. updated_at is UTC.
CREATE TABLE IF NOT EXISTS fencekit_guard (
    resource   VARBINARY(1024) NOT NULL,
    token      BIGINT          NOT NULL,
    holder     VARBINARY(1024) NOT NULL,
    admissions BIGINT UNSIGNED NOT NULL DEFAULT 1,
    updated_at DATETIME(6)     NOT NULL,
    PRIMARY KEY (resource),
    CHECK (token >= 1),
    CHECK (holder <> '')
) ENGINE = InnoDB ROW_FORMAT = DYNAMIC;

-- +goose Down
DROP TABLE IF EXISTS fencekit_guard;
