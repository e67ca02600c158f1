-- +goose Up
-- fencekit_once keeps one completion record per key of work run through the
-- storage/postgres package's Once: the fence the work ran under and when. A
-- record commits in the same transaction as its work, and the primary key
-- lets only one transaction hold a key, so a key's work commits at most once.
-- fencekit never deletes a record: deleting one lets the key's work run again.
CREATE TABLE fencekit_once (
    key      text        PRIMARY KEY CHECK (key <> ''),
    resource text        NOT NULL,
    token    bigint      NOT NULL CHECK (token >= 1),
    holder   text        NOT NULL,
    done_at  timestamptz NOT NULL DEFAULT now()
);

-- Deleting records by age (the retention the application chooses) reads
-- this index instead of the whole table.
CREATE INDEX fencekit_once_done_at ON fencekit_once (done_at);

-- +goose Down
DROP TABLE fencekit_once;
