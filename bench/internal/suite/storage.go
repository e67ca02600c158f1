package suite

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/migrations"
	"github.com/fencekit/fencekit/storage/postgres"
	fkredis "github.com/fencekit/fencekit/storage/redis"
)

// Pair is a fenced operation and its plain counterpart, interleaved
// operation by operation.
type Pair struct {
	Name         string
	Fenced       string // what the fenced side is
	Plain        string // what the plain side is
	Ops          int
	FencedMean   time.Duration
	PlainMean    time.Duration
	FencedP50    time.Duration
	PlainP50     time.Duration
	FencedAllocs float64
	PlainAllocs  float64
}

// Ratio is the fenced mean over the plain mean.
func (p Pair) Ratio() float64 { return float64(p.FencedMean) / float64(p.PlainMean) }

// runPair alternates fenced and plain ops times (which goes first alternates
// too), then counts each one's allocations alone.
func runPair(p Pair, ops int, fenced, plain func() error) (Pair, error) {
	for range 200 { // connections, statement caches, scripts
		if err := fenced(); err != nil {
			return p, fmt.Errorf("%s: %w", p.Fenced, err)
		}
		if err := plain(); err != nil {
			return p, fmt.Errorf("%s: %w", p.Plain, err)
		}
	}
	fs := make([]time.Duration, 0, ops)
	ps := make([]time.Duration, 0, ops)
	for i := range ops {
		for k := range 2 {
			t0 := time.Now()
			var err error
			if (i+k)%2 == 0 {
				err = fenced()
				fs = append(fs, time.Since(t0))
			} else {
				err = plain()
				ps = append(ps, time.Since(t0))
			}
			if err != nil {
				return p, err
			}
		}
	}
	p.Ops = ops
	p.FencedMean, p.PlainMean = mean(fs), mean(ps)
	p.FencedP50, p.PlainP50 = percentile(fs, 0.5), percentile(ps, 0.5)
	var err error
	if p.FencedAllocs, err = allocs(min(ops, 2000), fenced); err != nil {
		return p, err
	}
	if p.PlainAllocs, err = allocs(min(ops, 2000), plain); err != nil {
		return p, err
	}
	return p, nil
}

func allocs(n int, f func() error) (float64, error) {
	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	for range n {
		if err := f(); err != nil {
			return 0, err
		}
	}
	runtime.ReadMemStats(&m1)
	return float64(m1.Mallocs-m0.Mallocs) / float64(n), nil
}

// RunRedisStorage compares the fenced Get and Set of storage/redis with plain
// GET and SET of a 32-byte value on srv.
func RunRedisStorage(ctx context.Context, srv *Server, ops int, prefix string) ([]Pair, error) {
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer c.Close()
	store, err := fkredis.New(c, fkredis.WithPrefix(prefix+"store:"))
	if err != nil {
		return nil, err
	}
	f := fence.Fence{Resource: "bench", Token: 1, Holder: "bench-holder"}
	value := []byte("0123456789abcdef0123456789abcdef")
	plainKey := prefix + "plain"
	if _, err := store.FencedSet(ctx, f, "fenced", value); err != nil {
		return nil, err
	}
	if err := c.Set(ctx, plainKey, value, 0).Err(); err != nil {
		return nil, err
	}
	get, err := runPair(Pair{Name: "Redis read", Fenced: "`Store.FencedGet`", Plain: "GET"}, ops,
		func() error { _, err := store.FencedGet(ctx, f, "fenced"); return err },
		func() error { return c.Get(ctx, plainKey).Err() })
	if err != nil {
		return nil, err
	}
	set, err := runPair(Pair{Name: "Redis write", Fenced: "`Store.FencedSet`", Plain: "SET"}, ops,
		func() error { _, err := store.FencedSet(ctx, f, "fenced", value); return err },
		func() error { return c.Set(ctx, plainKey, value, 0).Err() })
	if err != nil {
		return nil, err
	}
	return []Pair{get, set}, nil
}

// RunPostgres compares postgres.Exec (guard and UPDATE pipelined in one
// implicit transaction) with the same UPDATE in autocommit, in a schema of
// the suite's own that it drops afterwards.
func RunPostgres(ctx context.Context, url, schema string, ops int) (Pair, error) {
	p := Pair{Name: "PostgreSQL write", Fenced: "`postgres.Exec` (guard + UPDATE)", Plain: "autocommit UPDATE"}
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		return p, err
	}
	defer admin.Close(ctx)
	ident := pgx.Identifier{schema}.Sanitize()
	if _, err := admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+ident+" CASCADE; CREATE SCHEMA "+ident); err != nil {
		return p, err
	}
	defer admin.Exec(context.WithoutCancel(ctx), "DROP SCHEMA IF EXISTS "+ident+" CASCADE")
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return p, err
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return p, err
	}
	defer pool.Close()
	if err := migrations.UpPool(ctx, pool); err != nil {
		return p, err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE counter (id int PRIMARY KEY, n bigint NOT NULL);
		INSERT INTO counter VALUES (1, 0), (2, 0)`); err != nil {
		return p, err
	}
	f := fence.Fence{Resource: "counter", Token: 1, Holder: "bench-holder"}
	const update = `UPDATE counter SET n = n + 1 WHERE id = $1`
	stmt := postgres.Statement{SQL: update, Args: []any{1}}
	return runPair(p, ops,
		func() error { _, err := postgres.Exec(ctx, pool, f, stmt); return err },
		func() error { _, err := pool.Exec(ctx, update, 2); return err })
}
