package main

// The example's own tables on MySQL or MariaDB, in the DSN's database next
// to fencekit's guard table.
const (
	myCreateUsersSQL = `CREATE TABLE IF NOT EXISTS lottery_users (
    id   BIGINT      PRIMARY KEY,
    name VARCHAR(64) NOT NULL
)`

	// The day is the draw key: the primary key allows one draw per day
	// whoever records it.
	myCreateDrawsSQL = `CREATE TABLE IF NOT EXISTS lottery_draws (
    day      DATE            PRIMARY KEY,
    token    BIGINT          NOT NULL,
    holder   VARBINARY(1024) NOT NULL,
    instance INT             NOT NULL,
    drawn_at DATETIME(6)     NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
)`

	// Each winner row names the token that wrote it, so a draw whose winners
	// came from two holders is visible.
	myCreateWinnersSQL = `CREATE TABLE IF NOT EXISTS lottery_winners (
    day     DATE   NOT NULL,
    user_id BIGINT NOT NULL,
    token   BIGINT NOT NULL,
    PRIMARY KEY (day, user_id),
    FOREIGN KEY (day) REFERENCES lottery_draws (day),
    FOREIGN KEY (user_id) REFERENCES lottery_users (id)
)`

	// mySeedUserSQL adds one user unless it exists; fixed ids make a
	// concurrent seed harmless.
	mySeedUserSQL = `INSERT INTO lottery_users (id, name) VALUES (?, ?) ON DUPLICATE KEY UPDATE id = id`

	myCountUsersSQL = `SELECT COUNT(*) FROM lottery_users`

	// myFindDrawSQL is the check that decides whether an instance draws.
	myFindDrawSQL = `SELECT token FROM lottery_draws WHERE day = ?`

	myChooseWinnersSQL = `SELECT id FROM lottery_users ORDER BY RAND() LIMIT ?`

	// myInsertDrawSQL records the draw unless the day already has one: an
	// existing day is left as it is and counts 0 rows.
	myInsertDrawSQL = `INSERT INTO lottery_draws (day, token, holder, instance)
VALUES (?, ?, ?, ?)
ON DUPLICATE KEY UPDATE day = day`

	// myInsertWinnerSQL records one chosen user as a winner of the day. It
	// relies on the fence, not on the draw insert above, to keep a stale
	// holder out: that is what the unfenced mode shows.
	myInsertWinnerSQL = `INSERT INTO lottery_winners (day, user_id, token) VALUES (?, ?, ?)
ON DUPLICATE KEY UPDATE day = day`

	myReadDrawSQL = `SELECT token, holder, instance, drawn_at FROM lottery_draws WHERE day = ?`

	myReadWinnersSQL = `SELECT w.user_id, u.name, w.token
FROM lottery_winners AS w JOIN lottery_users AS u ON u.id = w.user_id
WHERE w.day = ? ORDER BY w.user_id`
)
