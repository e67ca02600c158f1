package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"time"

	drv "github.com/go-sql-driver/mysql"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lock"
	"github.com/fencekit/fencekit/lock/mysqllock"
	"github.com/fencekit/fencekit/migrations"
	"github.com/fencekit/fencekit/storage/mysql"
)

// The example's own tables on MySQL or MariaDB, in the DSN's database next to
// fencekit's guard and completion tables.
const (
	myCreateUsersSQL = `CREATE TABLE IF NOT EXISTS lottery_users (
    id   BIGINT      PRIMARY KEY,
    name VARCHAR(64) NOT NULL
)`

	// Each winner row names the token that drew it, so a day whose winners
	// came from two draws is visible. Nothing here keeps a second draw out:
	// that is Once's completion record.
	myCreateWinnersSQL = `CREATE TABLE IF NOT EXISTS lottery_day_winners (
    day     DATE   NOT NULL,
    user_id BIGINT NOT NULL,
    token   BIGINT NOT NULL,
    PRIMARY KEY (day, user_id),
    FOREIGN KEY (user_id) REFERENCES lottery_users (id)
)`

	// mySeedUserSQL adds one user unless it exists; fixed ids make a
	// concurrent seed harmless.
	mySeedUserSQL = `INSERT INTO lottery_users (id, name) VALUES (?, ?) ON DUPLICATE KEY UPDATE id = id`

	myCountUsersSQL    = `SELECT COUNT(*) FROM lottery_users`
	myChooseWinnersSQL = `SELECT id FROM lottery_users ORDER BY RAND() LIMIT ?`
	myInsertWinnerSQL  = `INSERT INTO lottery_day_winners (day, user_id, token) VALUES (?, ?, ?)
ON DUPLICATE KEY UPDATE day = day`

	// myAnyWinnerSQL is the unfenced run's check: a day with winners is drawn.
	myAnyWinnerSQL = `SELECT token FROM lottery_day_winners WHERE day = ? LIMIT 1`

	myReadWinnersSQL = `SELECT w.user_id, u.name, w.token
FROM lottery_day_winners AS w JOIN lottery_users AS u ON u.id = w.user_id
WHERE w.day = ? ORDER BY w.user_id`
)

// myStore records draws in MySQL or MariaDB, through database/sql.
type myStore struct {
	cfg *drv.Config
	db  *sql.DB
}

func connectMySQL(ctx context.Context, dsn string) (*myStore, error) {
	cfg, err := drv.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("%w: MySQL DSN: %w", errConfig, err)
	}
	// Days and times are read as time.Time, in UTC.
	cfg.ParseTime, cfg.Loc = true, time.UTC
	if cfg.Timeout == 0 {
		cfg.Timeout = 3 * time.Second
	}
	db, err := openMySQL(cfg)
	if err != nil {
		return nil, err
	}
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, &unreachableError{Server: "MySQL", Flag: "-mysql", Err: err}
	}
	return &myStore{cfg: cfg, db: db}, nil
}

func openMySQL(cfg *drv.Config) (*sql.DB, error) {
	conn, err := drv.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: MySQL DSN: %w", errConfig, err)
	}
	return sql.OpenDB(conn), nil
}

func (s *myStore) close() { s.db.Close() }

func (s *myStore) setup(ctx context.Context, users int) error {
	if err := migrations.UpMySQL(ctx, s.db); err != nil {
		return fmt.Errorf("lottery: %w", err)
	}
	for _, q := range []string{myCreateUsersSQL, myCreateWinnersSQL} {
		if _, err := s.db.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("lottery: setup: %w", err)
		}
	}
	n, err := s.countUsers(ctx)
	if err != nil {
		return fmt.Errorf("lottery: setup: %w", err)
	}
	for id := n + 1; id <= users; id++ {
		if _, err := s.db.ExecContext(ctx, mySeedUserSQL, id, "user-"+strconv.Itoa(id)); err != nil {
			return fmt.Errorf("lottery: setup: %w", err)
		}
	}
	return nil
}

func (s *myStore) countUsers(ctx context.Context) (int, error) {
	var n int
	err := s.db.QueryRowContext(ctx, myCountUsersSQL).Scan(&n)
	return n, err
}

func (s *myStore) readDay(ctx context.Context, day time.Time) (*Record, []Winner, error) {
	rec, ok, err := lookupDrawMySQL(ctx, s.db, day)
	if err != nil {
		return nil, nil, err
	}
	rows, err := s.db.QueryContext(ctx, myReadWinnersSQL, day)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	var winners []Winner
	for rows.Next() {
		var w Winner
		if err := rows.Scan(&w.UserID, &w.Name, &w.Token); err != nil {
			return nil, nil, err
		}
		winners = append(winners, w)
	}
	if !ok {
		return nil, winners, rows.Err()
	}
	return &rec, winners, rows.Err()
}

// lookupDrawMySQL reads the day's completion record.
func lookupDrawMySQL(ctx context.Context, db mysql.Querier, day time.Time) (Record, bool, error) {
	r, err := mysql.LookupOnce(ctx, db, drawKey(day))
	if errors.Is(err, fence.ErrNotFound) {
		return Record{}, false, nil
	}
	return Record{Token: r.Token, HolderMark: r.HolderMark, Done: r.Done}, err == nil, err
}

func (s *myStore) instance(context.Context) (instanceStore, error) {
	db, err := openMySQL(s.cfg)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(2)
	return myInstance{db}, nil
}

// myInstance is one instance's *sql.DB.
type myInstance struct{ db *sql.DB }

func (m myInstance) close() { m.db.Close() }

func (m myInstance) drawn(ctx context.Context, cfg Config) (Record, bool, error) {
	if !cfg.Unfenced {
		return lookupDrawMySQL(ctx, m.db, cfg.Day)
	}
	var rec Record
	err := m.db.QueryRowContext(ctx, myAnyWinnerSQL, cfg.Day).Scan(&rec.Token)
	if errors.Is(err, sql.ErrNoRows) {
		return rec, false, nil
	}
	return rec, err == nil, err
}

func (m myInstance) draw(ctx context.Context, cfg Config, f fence.Fence) (ran bool, chosen []int64, err error) {
	work := func(ctx context.Context, tx *sql.Tx) error {
		rows, err := tx.QueryContext(ctx, myChooseWinnersSQL, cfg.Winners)
		if err != nil {
			return err
		}
		defer rows.Close()
		var c []int64
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				return err
			}
			c = append(c, id)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		for _, u := range c {
			if _, err := tx.ExecContext(ctx, myInsertWinnerSQL, cfg.Day, u, int64(f.Token)); err != nil {
				return err
			}
		}
		chosen = c
		return nil
	}
	if !cfg.Unfenced {
		ran, err = mysql.Once(ctx, m.db, f, drawKey(cfg.Day), work)
		return ran, chosen, err
	}
	tx, err := m.db.BeginTx(ctx, nil)
	if err != nil {
		return false, nil, err
	}
	defer tx.Rollback()
	if err := work(ctx, tx); err != nil {
		return false, nil, err
	}
	err = tx.Commit()
	return err == nil, chosen, err
}

// mysqlLocker is an instance's lock on MySQL or MariaDB alone
// (lock/mysqllock), on a *sql.DB of its own, as a separate process would
// have; its tables come from the same migrations.UpMySQL as the guard's.
func mysqlLocker(dsn string) (*lock.Locker, func(), error) {
	cfg, err := drv.ParseDSN(dsn)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: MySQL DSN: %w", errConfig, err)
	}
	db, err := openMySQL(cfg)
	if err != nil {
		return nil, nil, err
	}
	l, err := mysqllock.New(db)
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return l, func() { l.Close(); db.Close() }, nil
}
