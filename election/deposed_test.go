package election_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/migrations"
	"github.com/fencekit/fencekit/storage/mysql"
	"github.com/fencekit/fencekit/storage/postgres"
	fkredis "github.com/fencekit/fencekit/storage/redis"
)

// TestDeposedLeaderWritesRefused cuts a leader off from Redis (it still
// reaches storage), lets the next candidate win and write, and then has the
// deposed leader write with its old term's fence: every fencekit store
// refuses it as stale. The control write, made without a fence, goes
// through and overwrites the new leader's row: what an unfenced elector's
// deposed leader does.
func TestDeposedLeaderWritesRefused(t *testing.T) {
	testenv.Slow(t)
	srv := testenv.StartRedis(t)
	var r cutRound
	for i := 0; ; i++ {
		var ok bool
		if r, ok = cutLeader(t, srv, "deposed"+strings.Repeat("-again", i)); ok {
			break
		}
		if i == 4 {
			t.Fatal("the leader's term ended before the cut in five tries")
		}
	}
	oldF, newF := r.a.Fence(), r.b.Fence()

	t.Run("redis", func(t *testing.T) {
		ctx := context.Background()
		store, err := fkredis.New(srv.Client(), fkredis.WithPrefix("data:"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := store.FencedSet(ctx, newF, "{deposed}:heartbeat", []byte("b")); err != nil {
			t.Fatal(err)
		}
		_, err = store.FencedSet(ctx, oldF, "{deposed}:heartbeat", []byte("a"))
		var stale *fence.StaleError
		if !errors.Is(err, fence.ErrStale) || !errors.As(err, &stale) || stale.HighWater.Token != newF.Token {
			t.Fatalf("deposed leader's Set: %v, want a stale refusal at the new term's token", err)
		}
		v, err := store.Load(ctx, "{deposed}:heartbeat")
		if err != nil || string(v.Data) != "b" {
			t.Fatalf("value after the deposed write: %q, %v; want the new leader's", v.Data, err)
		}
	})

	t.Run("postgres", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		pool := testenv.Postgres(t)
		if err := migrations.UpPool(ctx, pool); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `CREATE TABLE heartbeat (id int PRIMARY KEY, leader text NOT NULL)`); err != nil {
			t.Fatal(err)
		}
		write := func(f fence.Fence, who string) error {
			return postgres.InTx(ctx, pool, pgx.TxOptions{}, f, func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO heartbeat VALUES (1, $1) ON CONFLICT (id) DO UPDATE SET leader = $1`, who)
				return err
			})
		}
		if err := write(newF, "b"); err != nil {
			t.Fatal(err)
		}
		if err := write(oldF, "a"); !errors.Is(err, fence.ErrStale) {
			t.Fatalf("deposed leader's write: %v, want fence.ErrStale", err)
		}
		var who string
		if err := pool.QueryRow(ctx, `SELECT leader FROM heartbeat WHERE id = 1`).Scan(&who); err != nil || who != "b" {
			t.Fatalf("row after the deposed write: %q, %v; want the new leader's", who, err)
		}
		// Control: the same late write without a fence overwrites the row.
		if _, err := pool.Exec(ctx, `UPDATE heartbeat SET leader = 'a' WHERE id = 1`); err != nil {
			t.Fatal(err)
		}
		if err := pool.QueryRow(ctx, `SELECT leader FROM heartbeat WHERE id = 1`).Scan(&who); err != nil || who != "a" {
			t.Fatalf("control: unfenced write left %q, %v", who, err)
		}
	})

	t.Run("mysql", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		db := testenv.MySQL(t)
		if err := migrations.UpMySQL(ctx, db); err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, `CREATE TABLE heartbeat (id INT PRIMARY KEY, leader VARCHAR(64) NOT NULL)`); err != nil {
			t.Fatal(err)
		}
		write := func(f fence.Fence, who string) error {
			return mysql.InTx(ctx, db, nil, f, func(ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, `INSERT INTO heartbeat VALUES (1, ?) ON DUPLICATE KEY UPDATE leader = VALUES(leader)`, who)
				return err
			})
		}
		if err := write(newF, "b"); err != nil {
			t.Fatal(err)
		}
		if err := write(oldF, "a"); !errors.Is(err, fence.ErrStale) {
			t.Fatalf("deposed leader's write: %v, want fence.ErrStale", err)
		}
		var who string
		if err := db.QueryRowContext(ctx, `SELECT leader FROM heartbeat WHERE id = 1`).Scan(&who); err != nil || who != "b" {
			t.Fatalf("row after the deposed write: %q, %v; want the new leader's", who, err)
		}
	})
}
