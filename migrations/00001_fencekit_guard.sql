-- +goose Up
-- The guard table keeps one high-water mark per resource: the newest fence
-- (token, holder) a store admitted for it. Rows are only ever raised, never
-- lowered or deleted by fencekit.
CREATE TABLE fencekit_guard (
    resource   text        PRIMARY KEY,
    token      bigint      NOT NULL CHECK (token >= 1),
    holder     text        NOT NULL CHECK (holder <> ''),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE fencekit_guard;
