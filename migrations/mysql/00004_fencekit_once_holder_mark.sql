-- +goose Up
-- fencekit_once.holder keeps the holder's mark (fence.HolderMark: '#' and the
-- first 8 hex digits of the SHA-256 of the holder id), the same mark logs,
-- errors and spans show, instead of the holder id itself: the id is the
-- lock's secret (whoever has it can release or extend the lock), and a row
-- holding the mark can be matched with a log line. Records written before
-- this migration are converted; marks (starting with '#') are left as they
-- are, so running the UPDATE again changes nothing.
UPDATE fencekit_once
SET holder = CONCAT('#', LEFT(SHA2(holder, 256), 8))
WHERE LEFT(holder, 1) <> '#' AND holder <> '';

-- +goose Down
-- The holder ids cannot be recovered from their marks: Down changes nothing.
DO 0;
