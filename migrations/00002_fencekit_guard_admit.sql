-- +goose Up
-- fencekit_guard_admit applies the admission rule to one resource and raises
-- SQLSTATE FK001 when the fence is stale, so that a stale guard sent in a
-- pipelined batch aborts the whole implicit transaction instead of merely
-- returning no row. The error's DETAIL is a JSON object with the mark the
-- fence lost to: {"token": <bigint>, "holder": <text>}.
--
-- The upsert locks the guard row even when the admission fails; the mark read
-- afterwards is therefore the one that refused the fence.
-- +goose StatementBegin
CREATE FUNCTION fencekit_guard_admit(p_resource text, p_token bigint, p_holder text)
RETURNS void
LANGUAGE plpgsql
VOLATILE
AS $$
DECLARE
    hw_token  bigint;
    hw_holder text;
BEGIN
    INSERT INTO fencekit_guard AS g (resource, token, holder)
    VALUES (p_resource, p_token, p_holder)
    ON CONFLICT (resource) DO UPDATE
        SET token = EXCLUDED.token, holder = EXCLUDED.holder, updated_at = now()
        WHERE EXCLUDED.token > g.token
           OR (EXCLUDED.token = g.token AND EXCLUDED.holder = g.holder);
    IF FOUND THEN
        RETURN;
    END IF;
    SELECT g.token, g.holder INTO hw_token, hw_holder
    FROM fencekit_guard AS g WHERE g.resource = p_resource;
    RAISE EXCEPTION 'fencekit: stale fence for resource %: token % lost to token %', p_resource, p_token, hw_token
        USING ERRCODE = 'FK001',
              DETAIL = json_build_object('token', hw_token, 'holder', hw_holder)::text;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION fencekit_guard_admit(text, bigint, text);
