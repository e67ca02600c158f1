package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/migrations"
	"github.com/fencekit/fencekit/storage/postgres"
)

// The example's own tables, in the first schema of the connection's
// search_path, next to fencekit's guard and completion tables.
const (
	// setupLockSQL serialises setup across processes that start at once:
	// concurrent CREATE TABLE IF NOT EXISTS can still collide in the catalog.
	setupLockSQL = `SELECT pg_advisory_xact_lock(7132205946410627705)`

	createUsersSQL = `CREATE TABLE IF NOT EXISTS lottery_users (
    id   bigint PRIMARY KEY,
    name text   NOT NULL
)`

	// Each winner row names the token that drew it, so a day whose winners
	// came from two draws is visible. Nothing here keeps a second draw out:
	// that is Once's completion record.
	createWinnersSQL = `CREATE TABLE IF NOT EXISTS lottery_day_winners (
    day     date   NOT NULL,
    user_id bigint NOT NULL REFERENCES lottery_users (id),
    token   bigint NOT NULL,
    PRIMARY KEY (day, user_id)
)`

	// seedUsersSQL adds users 1..$1 that are missing; fixed ids make a
	// concurrent seed harmless.
	seedUsersSQL = `INSERT INTO lottery_users (id, name)
SELECT g, 'user-' || g FROM generate_series(1, $1::bigint) AS g
ON CONFLICT (id) DO NOTHING`

	countUsersSQL    = `SELECT count(*) FROM lottery_users`
	chooseWinnersSQL = `SELECT id FROM lottery_users ORDER BY random() LIMIT $1`
	insertWinnersSQL = `INSERT INTO lottery_day_winners (day, user_id, token)
SELECT $1, u, $2 FROM unnest($3::bigint[]) AS u
ON CONFLICT (day, user_id) DO NOTHING`

	// anyWinnerSQL is the unfenced run's check: a day with winners is drawn.
	anyWinnerSQL = `SELECT token FROM lottery_day_winners WHERE day = $1 LIMIT 1`

	readWinnersSQL = `SELECT w.user_id, u.name, w.token
FROM lottery_day_winners AS w JOIN lottery_users AS u ON u.id = w.user_id
WHERE w.day = $1 ORDER BY w.user_id`
)

// pgStore records draws in PostgreSQL, through pgx.
type pgStore struct {
	url  string
	pool *pgxpool.Pool
}

func connectPostgres(ctx context.Context, url string) (*pgStore, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("%w: PostgreSQL URL: %w", errConfig, err)
	}
	pc.ConnConfig.ConnectTimeout = 3 * time.Second
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, &unreachableError{Server: "PostgreSQL", Flag: "-postgres", Err: err}
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, &unreachableError{Server: "PostgreSQL", Flag: "-postgres", Err: err}
	}
	return &pgStore{url: url, pool: pool}, nil
}

func (s *pgStore) close() { s.pool.Close() }

func (s *pgStore) setup(ctx context.Context, users int) error {
	db := stdlib.OpenDBFromPool(s.pool)
	defer db.Close()
	if err := migrations.Up(ctx, db); err != nil {
		return fmt.Errorf("lottery: %w", err)
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		for _, sql := range []string{setupLockSQL, createUsersSQL, createWinnersSQL} {
			if _, err := tx.Exec(ctx, sql); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, seedUsersSQL, users)
		return err
	})
	if err != nil {
		return fmt.Errorf("lottery: setup: %w", err)
	}
	return nil
}

func (s *pgStore) countUsers(ctx context.Context) (int, error) {
	var n int
	err := s.pool.QueryRow(ctx, countUsersSQL).Scan(&n)
	return n, err
}

func (s *pgStore) readDay(ctx context.Context, day time.Time) (*Record, []Winner, error) {
	rec, ok, err := lookupDraw(ctx, s.pool, day)
	if err != nil {
		return nil, nil, err
	}
	rows, _ := s.pool.Query(ctx, readWinnersSQL, day)
	winners, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Winner, error) {
		var w Winner
		err := row.Scan(&w.UserID, &w.Name, &w.Token)
		return w, err
	})
	if !ok {
		return nil, winners, err
	}
	return &rec, winners, err
}

// lookupDraw reads the day's completion record.
func lookupDraw(ctx context.Context, db postgres.Querier, day time.Time) (Record, bool, error) {
	r, err := postgres.LookupOnce(ctx, db, drawKey(day))
	if errors.Is(err, fence.ErrNotFound) {
		return Record{}, false, nil
	}
	return Record{Token: r.Token, HolderMark: r.HolderMark, Done: r.Done}, err == nil, err
}

func (s *pgStore) instance(ctx context.Context) (instanceStore, error) {
	pc, err := pgxpool.ParseConfig(s.url)
	if err != nil {
		return nil, err
	}
	pc.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, err
	}
	return pgInstance{pool}, nil
}

// pgInstance is one instance's pool.
type pgInstance struct{ pool *pgxpool.Pool }

func (p pgInstance) close() { p.pool.Close() }

func (p pgInstance) drawn(ctx context.Context, cfg Config) (Record, bool, error) {
	if !cfg.Unfenced {
		return lookupDraw(ctx, p.pool, cfg.Day)
	}
	var rec Record
	err := p.pool.QueryRow(ctx, anyWinnerSQL, cfg.Day).Scan(&rec.Token)
	if errors.Is(err, pgx.ErrNoRows) {
		return rec, false, nil
	}
	return rec, err == nil, err
}

func (p pgInstance) draw(ctx context.Context, cfg Config, f fence.Fence) (ran bool, chosen []int64, err error) {
	work := func(ctx context.Context, tx pgx.Tx) error {
		rows, _ := tx.Query(ctx, chooseWinnersSQL, cfg.Winners)
		c, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, insertWinnersSQL, cfg.Day, int64(f.Token), c); err != nil {
			return err
		}
		chosen = c
		return nil
	}
	if cfg.Unfenced {
		err = pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error { return work(ctx, tx) })
		return err == nil, chosen, err
	}
	ran, err = postgres.Once(ctx, p.pool, f, drawKey(cfg.Day), work)
	return ran, chosen, err
}
