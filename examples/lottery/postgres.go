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
		for _, sql := range []string{setupLockSQL, createUsersSQL, createDrawsSQL, createWinnersSQL} {
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

func (s *pgStore) readDraw(ctx context.Context, day time.Time) (int, Recorded, error) {
	var d Recorded
	var token int64
	err := s.pool.QueryRow(ctx, readDrawSQL, day).Scan(&token, &d.Holder, &d.Instance, &d.DrawnAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, d, nil
	}
	if err != nil {
		return 0, d, fmt.Errorf("lottery: read draw: %w", err)
	}
	d.Token = fence.Token(token)
	rows, _ := s.pool.Query(ctx, readWinnersSQL, day)
	d.Winners, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Winner, error) {
		var w Winner
		var t int64
		err := row.Scan(&w.UserID, &w.Name, &t)
		w.Token = fence.Token(t)
		return w, err
	})
	if err != nil {
		return 0, d, fmt.Errorf("lottery: read winners: %w", err)
	}
	return 1, d, nil
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

func (p pgInstance) read(ctx context.Context, cfg Config, f fence.Fence) (existing fence.Token, chosen []int64, err error) {
	fn := func(ctx context.Context, tx pgx.Tx) error {
		existing, chosen = 0, nil
		var token int64
		err := tx.QueryRow(ctx, findDrawSQL, cfg.Day).Scan(&token)
		if err == nil {
			existing = fence.Token(token)
			return nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		rows, _ := tx.Query(ctx, chooseWinnersSQL, cfg.Winners)
		chosen, err = pgx.CollectRows(rows, pgx.RowTo[int64])
		return err
	}
	if cfg.Unfenced {
		err = pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error { return fn(ctx, tx) })
	} else {
		err = postgres.InTx(ctx, p.pool, pgx.TxOptions{}, f, fn)
	}
	return existing, chosen, err
}

// record sends the draw and its winners as one batch. With the fence the
// guard leads the batch and a stale fence aborts it whole.
func (p pgInstance) record(ctx context.Context, cfg Config, f fence.Fence, id int, chosen []int64) (int64, error) {
	stmts := []postgres.Statement{
		{SQL: insertDrawSQL, Args: []any{cfg.Day, int64(f.Token), f.Holder, id}},
		{SQL: insertWinnersSQL, Args: []any{cfg.Day, int64(f.Token), chosen}},
	}
	if !cfg.Unfenced {
		tags, err := postgres.Exec(ctx, p.pool, f, stmts...)
		if err != nil {
			return 0, err
		}
		return tags[0].RowsAffected(), nil
	}
	b := &pgx.Batch{}
	for _, s := range stmts {
		b.Queue(s.SQL, s.Args...)
	}
	br := p.pool.SendBatch(ctx, b)
	tag, err := br.Exec()
	if err == nil {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag.RowsAffected(), err
}
