package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
)

// Config describes one run of the job: which day to draw, how many
// instances race for it and where the servers are.
type Config struct {
	// Store names the database that holds users, draws and the guard
	// table: "postgres" or "mysql". default: "postgres".
	Store string
	// PostgresURL is the PostgreSQL database, for Store "postgres".
	PostgresURL string
	// MySQLDSN is the MySQL or MariaDB database, as a go-sql-driver DSN,
	// for Store "mysql".
	MySQLDSN string
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
	if c.Store == "" {
		c.Store = storePostgres
	}
	switch {
	case c.Store != storePostgres && c.Store != storeMySQL:
		return c, fmt.Errorf("%w: store %q, want %q or %q", errConfig, c.Store, storePostgres, storeMySQL)
	case c.Store == storePostgres && c.PostgresURL == "":
		return c, fmt.Errorf("%w: empty PostgreSQL URL", errConfig)
	case c.Store == storeMySQL && c.MySQLDSN == "":
		return c, fmt.Errorf("%w: empty MySQL DSN", errConfig)
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
	db, err := openStore(ctx, cfg)
	if err != nil {
		return Result{}, err
	}
	defer db.close()
	if err := pingRedis(ctx, cfg.Redis); err != nil {
		return Result{}, err
	}
	if err := db.setup(ctx, cfg.Users); err != nil {
		return Result{}, err
	}
	users, err := db.countUsers(ctx)
	if err != nil {
		return Result{}, fmt.Errorf("lottery: count users: %w", err)
	}
	if users < cfg.Winners {
		return Result{}, fmt.Errorf("%w: %d winners but only %d users", errConfig, cfg.Winners, users)
	}

	r := &race{cfg: cfg, db: db, log: &logger{w: cfg.Log}, othersDone: make(chan struct{})}
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
	res.Draws, res.Draw, err = db.readDraw(ctx, cfg.Day)
	return res, err
}

// The stores a run can record its draw in.
const (
	storePostgres = "postgres"
	storeMySQL    = "mysql"
)

// store is the database a run records its draw in.
type store interface {
	// setup applies fencekit's migrations, creates the example's tables if
	// missing and seeds users; running it again changes nothing.
	setup(ctx context.Context, users int) error
	countUsers(ctx context.Context) (int, error)
	// readDraw returns how many draw rows the day has and, if one, that
	// draw with every winner row stored for the day.
	readDraw(ctx context.Context, day time.Time) (int, Recorded, error)
	// instance opens the connections of one instance, as a separate
	// process would have its own.
	instance(ctx context.Context) (instanceStore, error)
	close()
}

// instanceStore is one instance's view of the store.
type instanceStore interface {
	// read is the check before drawing: the day's draw token if there is
	// one, otherwise the chosen winners. With the fence it is a fenced read,
	// which raises the guard's mark so that older holders can no longer
	// write.
	read(ctx context.Context, cfg Config, f fence.Fence) (existing fence.Token, chosen []int64, err error)
	// record writes the draw and its winners in one transaction (fenced
	// unless cfg.Unfenced) and returns how many draw rows it inserted.
	record(ctx context.Context, cfg Config, f fence.Fence, id int, chosen []int64) (drawRows int64, err error)
	close()
}

func openStore(ctx context.Context, cfg Config) (store, error) {
	if cfg.Store == storeMySQL {
		return connectMySQL(ctx, cfg.MySQLDSN)
	}
	return connectPostgres(ctx, cfg.PostgresURL)
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
