-- +goose Up
-- fencekit_once keeps one completion record per key whose work
-- storage/mysql's Once committed: the fence it ran under and when. Records
-- stay until the application deletes them; deleting one lets its key run
-- again. Keys, resources and holders are VARBINARY, compared byte for byte.
-- done_at is UTC; its index serves deleting records by age.
CREATE TABLE IF NOT EXISTS fencekit_once (
    `key`    VARBINARY(1024) NOT NULL,
    resource VARBINARY(1024) NOT NULL,
    token    BIGINT          NOT NULL,
    holder   VARBINARY(1024) NOT NULL,
    done_at  DATETIME(6)     NOT NULL,
    PRIMARY KEY (`key`),
    KEY fencekit_once_done_at (done_at)
) ENGINE = InnoDB ROW_FORMAT = DYNAMIC;

-- +goose Down
DROP TABLE IF EXISTS fencekit_once;
