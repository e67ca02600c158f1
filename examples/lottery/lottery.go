package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/migrations"
)

// Config describes one run of the job: which day to draw, how many
// instances race for it and where the servers are.
type Config struct {
	// PostgresURL is the database holding users, draws and the guard table.
	PostgresURL string
	// Redis is where the instances take their lock. Each instance opens its
	// own client with these options.
	Redis redis.Options
	// LockPrefix is the lock's key prefix. default: the lock package's.
	LockPrefix string
	// Day is the date to draw for; only its year, month and day count.
	Day time.Time
	// Instances is how many instances race. default: 3.
	Instances int
	// Winners is how many distinct users one draw picks. default: 5.
	Winners int
	// Users is how many users setup seeds when fewer exist. default: 300.
	Users int
	// TTL is each instance's lease. default: 500ms.
	TTL time.Duration
	// Pause makes the first instance to win the lock stop after choosing
	// its winners and before recording them, until its lease has expired
	// and every other instance has finished.
	Pause bool
	// Unfenced runs the same job with the lock alone: plain reads and
	// writes, no fence. It exists to show what goes wrong.
	Unfenced bool
	// Log receives a line per step as it happens. default: none.
	Log io.Writer
}

// Result is what a run did and what the database holds for the day after it.
type Result struct {
	Day       string
	Instances []Instance
	// Draws is the number of draw rows for the day (the unique key keeps it
	// at most one).
	Draws int
	// Draw is the recorded draw, if Draws is one.
	Draw Recorded
}

// Recorded is a draw as stored.
type Recorded struct {
	Token    fence.Token
	Holder   string
	Instance int
	DrawnAt  time.Time
	Winners  []Winner
}

// Winner is one stored winner row and the token that wrote it.
type Winner struct {
	UserID int64
	Name   string
	Token  fence.Token
}

// Outcome is what one instance ended up doing.
type Outcome int

const (
	// Drew: the instance chose winners and recorded its draw.
	Drew Outcome = iota + 1
	// FoundExisting: the instance's read found the day already drawn.
	FoundExisting
	// RefusedStale: storage refused the instance's fence because a newer
	// holder had taken over; it wrote nothing.
	RefusedStale
	// LateWrite: the draw key already existed when the instance wrote, yet
	// its winner rows went in (only without the fence).
	LateWrite
)

func (o Outcome) String() string {
	switch o {
	case Drew:
		return "drew"
	case FoundExisting:
		return "found existing"
	case RefusedStale:
		return "refused as stale"
	case LateWrite:
		return "late write"
	}
	return "unknown"
}

// Instance reports one instance.
type Instance struct {
	ID      int
	Token   fence.Token
	Holder  string
	Outcome Outcome
	// Paused is set on the instance that was made to pause past its lease.
	Paused bool
	// Chosen are the users the instance picked, if it got that far.
	Chosen []int64
	// HighWater is the mark a refused fence lost to.
	HighWater fence.Fence
}

// unreachableError is a server the run could not reach; Flag names the
// command-line flag that points at it.
type unreachableError struct {
	Server, Flag string
	Err          error
}

func (e *unreachableError) Error() string {
	return fmt.Sprintf("cannot reach %s (check %s): %v", e.Server, e.Flag, e.Err)
}

func (e *unreachableError) Unwrap() error { return e.Err }

var errConfig = errors.New("lottery: invalid configuration")

// dayLayout is the -day format and the day's name in resources.
const dayLayout = "2006-01-02"

func (c Config) normalised() (Config, error) {
	if c.Instances == 0 {
		c.Instances = 3
	}
	if c.Winners == 0 {
		c.Winners = 5
	}
	if c.Users == 0 {
		c.Users = 300
	}
	if c.TTL == 0 {
		c.TTL = 500 * time.Millisecond
	}
	switch {
	case c.PostgresURL == "":
		return c, fmt.Errorf("%w: empty PostgreSQL URL", errConfig)
	case c.Redis.Addr == "":
		return c, fmt.Errorf("%w: empty Redis address", errConfig)
	case c.Day.IsZero():
		return c, fmt.Errorf("%w: no day", errConfig)
	case c.Instances < 1:
		return c, fmt.Errorf("%w: %d instances, need at least 1", errConfig, c.Instances)
	case c.Winners < 1:
		return c, fmt.Errorf("%w: %d winners, need at least 1", errConfig, c.Winners)
	case c.Users < 1:
		return c, fmt.Errorf("%w: %d users, need at least 1", errConfig, c.Users)
	case c.TTL < time.Millisecond:
		return c, fmt.Errorf("%w: lease %v is shorter than 1ms", errConfig, c.TTL)
	}
	c.Day = time.Date(c.Day.Year(), c.Day.Month(), c.Day.Day(), 0, 0, 0, 0, time.UTC)
	return c, nil
}

// Draw runs the job once: it prepares the schema, lets cfg.Instances
// instances race for the day's lock, and returns what each did and what the
// database holds for the day. With the fence, the day has at most one draw
// whose winners all come from one holder, however the instances pause; a
// day that is already drawn is left unchanged. ctx bounds the whole run.
func Draw(ctx context.Context, cfg Config) (Result, error) {
	cfg, err := cfg.normalised()
	if err != nil {
		return Result{}, err
	}
	if err := ctx.Err(); err != nil {
		return Result{}, fmt.Errorf("lottery: %w", err)
	}
	pool, err := connectPostgres(ctx, cfg.PostgresURL)
	if err != nil {
		return Result{}, err
	}
	defer pool.Close()
	if err := pingRedis(ctx, cfg.Redis); err != nil {
		return Result{}, err
	}
	if err := setup(ctx, pool, cfg.Users); err != nil {
		return Result{}, err
	}
	var users int
	if err := pool.QueryRow(ctx, countUsersSQL).Scan(&users); err != nil {
		return Result{}, fmt.Errorf("lottery: count users: %w", err)
	}
	if users < cfg.Winners {
		return Result{}, fmt.Errorf("%w: %d winners but only %d users", errConfig, cfg.Winners, users)
	}

	r := &race{cfg: cfg, log: &logger{w: cfg.Log}, othersDone: make(chan struct{})}
	if cfg.Instances == 1 {
		r.closeOthers()
	}
	res := Result{Day: cfg.Day.Format(dayLayout), Instances: make([]Instance, cfg.Instances)}
	errs := make([]error, cfg.Instances)
	var wg sync.WaitGroup
	for i := range cfg.Instances {
		wg.Go(func() {
			res.Instances[i], errs[i] = r.run(ctx, i+1)
			r.finished()
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return res, err
	}
	res.Draws, res.Draw, err = readDraw(ctx, pool, cfg.Day)
	return res, err
}

func connectPostgres(ctx context.Context, url string) (*pgxpool.Pool, error) {
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
	return pool, nil
}

func pingRedis(ctx context.Context, opt redis.Options) error {
	opt.DialTimeout = 2 * time.Second
	opt.MaxRetries = -1
	c := redis.NewClient(&opt)
	defer c.Close()
	if err := c.Ping(ctx).Err(); err != nil {
		return &unreachableError{Server: "Redis at " + opt.Addr, Flag: "-redis", Err: err}
	}
	return nil
}

// setup applies fencekit's migrations, creates the example's tables if
// missing and seeds users; running it again changes nothing.
func setup(ctx context.Context, pool *pgxpool.Pool, users int) error {
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	if err := migrations.Up(ctx, db); err != nil {
		return fmt.Errorf("lottery: %w", err)
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
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

// readDraw returns how many draw rows the day has and, if one, that draw
// with every winner row stored for the day.
func readDraw(ctx context.Context, db *pgxpool.Pool, day time.Time) (int, Recorded, error) {
	var d Recorded
	var token int64
	err := db.QueryRow(ctx, readDrawSQL, day).Scan(&token, &d.Holder, &d.Instance, &d.DrawnAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, d, nil
	}
	if err != nil {
		return 0, d, fmt.Errorf("lottery: read draw: %w", err)
	}
	d.Token = fence.Token(token)
	rows, _ := db.Query(ctx, readWinnersSQL, day)
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

// logger serialises the instances' lines.
type logger struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *logger) printf(format string, args ...any) {
	if l.w == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(l.w, format+"\n", args...)
}
