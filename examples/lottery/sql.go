package main

// The example's own tables. They live in the first schema of the
// connection's search_path, next to fencekit's guard table.
const (
	// setupLockSQL serialises setup across processes that start at once:
	// concurrent CREATE TABLE IF NOT EXISTS can still collide in the catalog.
	setupLockSQL = `SELECT pg_advisory_xact_lock(7132205946410627705)`

	createUsersSQL = `CREATE TABLE IF NOT EXISTS lottery_users (
    id   bigint PRIMARY KEY,
    name text   NOT NULL
)`

	// The day is the draw key: the unique constraint allows one draw per day
	// whoever records it.
	createDrawsSQL = `CREATE TABLE IF NOT EXISTS lottery_draws (
    day      date        PRIMARY KEY,
    token    bigint      NOT NULL,
    holder   text        NOT NULL,
    instance int         NOT NULL,
    drawn_at timestamptz NOT NULL DEFAULT now()
)`

	// Each winner row names the token that wrote it, so a draw whose winners
	// came from two holders is visible.
	createWinnersSQL = `CREATE TABLE IF NOT EXISTS lottery_winners (
    day     date   NOT NULL REFERENCES lottery_draws (day),
    user_id bigint NOT NULL REFERENCES lottery_users (id),
    token   bigint NOT NULL,
    PRIMARY KEY (day, user_id)
)`

	// seedUsersSQL adds users 1..$1 that are missing; fixed ids make a
	// concurrent seed harmless.
	seedUsersSQL = `INSERT INTO lottery_users (id, name)
SELECT g, 'user-' || g FROM generate_series(1, $1::bigint) AS g
ON CONFLICT (id) DO NOTHING`

	countUsersSQL = `SELECT count(*) FROM lottery_users`

	// findDrawSQL is the check that decides whether an instance draws.
	findDrawSQL = `SELECT token FROM lottery_draws WHERE day = $1`

	chooseWinnersSQL = `SELECT id FROM lottery_users ORDER BY random() LIMIT $1`

	// insertDrawSQL records the draw unless the day already has one.
	insertDrawSQL = `INSERT INTO lottery_draws (day, token, holder, instance)
VALUES ($1, $2, $3, $4)
ON CONFLICT (day) DO NOTHING`

	// insertWinnersSQL records the chosen users as the day's winners. It
	// relies on the fence, not on the draw insert above, to keep a stale
	// holder out: that is what the unfenced mode shows.
	insertWinnersSQL = `INSERT INTO lottery_winners (day, user_id, token)
SELECT $1, u, $2 FROM unnest($3::bigint[]) AS u
ON CONFLICT (day, user_id) DO NOTHING`

	readDrawSQL = `SELECT token, holder, instance, drawn_at FROM lottery_draws WHERE day = $1`

	readWinnersSQL = `SELECT w.user_id, u.name, w.token
FROM lottery_winners AS w JOIN lottery_users AS u ON u.id = w.user_id
WHERE w.day = $1 ORDER BY w.user_id`
)
