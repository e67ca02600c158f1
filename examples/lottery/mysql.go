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
	"github.com/fencekit/fencekit/migrations"
	"github.com/fencekit/fencekit/storage/mysql"
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
	for _, q := range []string{myCreateUsersSQL, myCreateDrawsSQL, myCreateWinnersSQL} {
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

func (s *myStore) readDraw(ctx context.Context, day time.Time) (int, Recorded, error) {
	var d Recorded
	var token int64
	err := s.db.QueryRowContext(ctx, myReadDrawSQL, day).Scan(&token, &d.Holder, &d.Instance, &d.DrawnAt)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, d, nil
	}
	if err != nil {
		return 0, d, fmt.Errorf("lottery: read draw: %w", err)
	}
	d.Token = fence.Token(token)
	rows, err := s.db.QueryContext(ctx, myReadWinnersSQL, day)
	if err != nil {
		return 0, d, fmt.Errorf("lottery: read winners: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var w Winner
		var t int64
		if err := rows.Scan(&w.UserID, &w.Name, &t); err != nil {
			return 0, d, fmt.Errorf("lottery: read winners: %w", err)
		}
		w.Token = fence.Token(t)
		d.Winners = append(d.Winners, w)
	}
	if err := rows.Err(); err != nil {
		return 0, d, fmt.Errorf("lottery: read winners: %w", err)
	}
	return 1, d, nil
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

// inTx runs fn in a transaction fenced by f, or in a plain one when the
// run is unfenced.
func (m myInstance) inTx(ctx context.Context, cfg Config, f fence.Fence, fn func(ctx context.Context, tx *sql.Tx) error) error {
	if !cfg.Unfenced {
		return mysql.InTx(ctx, m.db, nil, f, fn)
	}
	tx, err := m.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := fn(ctx, tx); err != nil {
		return err
	}
	return tx.Commit()
}

func (m myInstance) read(ctx context.Context, cfg Config, f fence.Fence) (existing fence.Token, chosen []int64, err error) {
	err = m.inTx(ctx, cfg, f, func(ctx context.Context, tx *sql.Tx) error {
		existing, chosen = 0, nil
		var token int64
		err := tx.QueryRowContext(ctx, myFindDrawSQL, cfg.Day).Scan(&token)
		if err == nil {
			existing = fence.Token(token)
			return nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		rows, err := tx.QueryContext(ctx, myChooseWinnersSQL, cfg.Winners)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				return err
			}
			chosen = append(chosen, id)
		}
		return rows.Err()
	})
	return existing, chosen, err
}

// record writes the draw and its winners in one transaction: with the
// fence, the guard is its first statement and a stale fence sends nothing
// else.
func (m myInstance) record(ctx context.Context, cfg Config, f fence.Fence, id int, chosen []int64) (int64, error) {
	var drawRows int64
	err := m.inTx(ctx, cfg, f, func(ctx context.Context, tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, myInsertDrawSQL, cfg.Day, int64(f.Token), f.Holder, id)
		if err != nil {
			return err
		}
		if drawRows, err = res.RowsAffected(); err != nil {
			return err
		}
		for _, u := range chosen {
			if _, err := tx.ExecContext(ctx, myInsertWinnerSQL, cfg.Day, u, int64(f.Token)); err != nil {
				return err
			}
		}
		return nil
	})
	return drawRows, err
}
