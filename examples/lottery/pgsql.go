package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/migrations"
	"github.com/fencekit/fencekit/storage/pgsql"
)

// sqlStore records draws in PostgreSQL through database/sql (pgx's stdlib
// driver) and storage/pgsql: the tables and statements are postgres.go's,
// the calls those an ORM's user makes on a *sql.DB.
type sqlStore struct {
	url string
	db  *sql.DB
}

func connectPgsql(ctx context.Context, url string) (*sqlStore, error) {
	db, err := openPgsql(url)
	if err != nil {
		return nil, err
	}
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, &unreachableError{Server: "PostgreSQL", Flag: "-postgres", Err: err}
	}
	return &sqlStore{url: url, db: db}, nil
}

func openPgsql(url string) (*sql.DB, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("%w: PostgreSQL URL: %w", errConfig, err)
	}
	cfg.ConnectTimeout = 3 * time.Second
	return stdlib.OpenDB(*cfg), nil
}

func (s *sqlStore) close() { s.db.Close() }

func (s *sqlStore) setup(ctx context.Context, users int) error {
	if err := migrations.Up(ctx, s.db); err != nil {
		return fmt.Errorf("lottery: %w", err)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("lottery: setup: %w", err)
	}
	defer tx.Rollback()
	for _, q := range []string{setupLockSQL, createUsersSQL, createWinnersSQL} {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("lottery: setup: %w", err)
		}
	}
	if _, err := tx.ExecContext(ctx, seedUsersSQL, users); err != nil {
		return fmt.Errorf("lottery: setup: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("lottery: setup: %w", err)
	}
	return nil
}

func (s *sqlStore) countUsers(ctx context.Context) (int, error) {
	var n int
	err := s.db.QueryRowContext(ctx, countUsersSQL).Scan(&n)
	return n, err
}

func (s *sqlStore) readDay(ctx context.Context, day time.Time) (*Record, []Winner, error) {
	rec, ok, err := lookupDrawPgsql(ctx, s.db, day)
	if err != nil {
		return nil, nil, err
	}
	rows, err := s.db.QueryContext(ctx, readWinnersSQL, day)
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

// lookupDrawPgsql reads the day's completion record.
func lookupDrawPgsql(ctx context.Context, db pgsql.Querier, day time.Time) (Record, bool, error) {
	r, err := pgsql.LookupOnce(ctx, db, drawKey(day))
	if errors.Is(err, fence.ErrNotFound) {
		return Record{}, false, nil
	}
	return Record{Token: r.Token, HolderMark: r.HolderMark, Done: r.Done}, err == nil, err
}

func (s *sqlStore) instance(context.Context) (instanceStore, error) {
	db, err := openPgsql(s.url)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(2)
	return sqlInstance{db}, nil
}

// sqlInstance is one instance's *sql.DB.
type sqlInstance struct{ db *sql.DB }

func (m sqlInstance) close() { m.db.Close() }

func (m sqlInstance) drawn(ctx context.Context, cfg Config) (Record, bool, error) {
	if !cfg.Unfenced {
		return lookupDrawPgsql(ctx, m.db, cfg.Day)
	}
	var rec Record
	err := m.db.QueryRowContext(ctx, anyWinnerSQL, cfg.Day).Scan(&rec.Token)
	if errors.Is(err, sql.ErrNoRows) {
		return rec, false, nil
	}
	return rec, err == nil, err
}

func (m sqlInstance) draw(ctx context.Context, cfg Config, f fence.Fence) (ran bool, chosen []int64, err error) {
	work := func(ctx context.Context, tx *sql.Tx) error {
		rows, err := tx.QueryContext(ctx, chooseWinnersSQL, cfg.Winners)
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
		if _, err := tx.ExecContext(ctx, insertWinnersSQL, cfg.Day, int64(f.Token), c); err != nil {
			return err
		}
		chosen = c
		return nil
	}
	if !cfg.Unfenced {
		ran, err = pgsql.Once(ctx, m.db, f, drawKey(cfg.Day), work)
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
