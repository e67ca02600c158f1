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
	// Store names the database that holds users, winners and fencekit's
	// tables: "postgres" (through pgx), "pgsql" (PostgreSQL through
	// database/sql) or "mysql". default: "postgres".
	Store string
	// PostgresURL is the PostgreSQL database, for Store "postgres" and
	// "pgsql".
	PostgresURL string
	// MySQLDSN is the MySQL or MariaDB database, as a go-sql-driver DSN,
	// for Store "mysql".
	MySQLDSN string
	// Lock names where the instances take their lock: "redis" (the Redis
	// lock, at Redis), "postgres" (lock/pglock, in the PostgreSQL
	// database at PostgresURL: no Redis at all; Store "postgres" or
	// "pgsql") or "mysql" (lock/mysqllock, in the MySQL or MariaDB
	// database at MySQLDSN: no Redis at all; Store "mysql"). default:
	// "redis".
	Lock string
	// Redis is where the instances take their lock, with Lock "redis". Each
	// instance opens its own client with these options.
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
	// Pause makes the first instance to win the lock stop after finding the
	// day not drawn and before drawing, until its lease has expired and
	// every other instance has finished.
	Pause bool
	// Unfenced runs the same job with the lock alone: no fence and no
	// completion record, only a check for the day's winners before drawing.
	// It exists to show what goes wrong.
	Unfenced bool
	// Log receives a line per step as it happens. default: none.
	Log io.Writer
}

// Result is what a run did and what the database holds for the day after it.
type Result struct {
	Day string
	// Key is the day's draw as Once knows it: the key of its completion
	// record.
	Key       string
	Instances []Instance
	// Record is the day's completion record, written by Once with the draw;
	// nil if the day has none (not drawn, or drawn with Unfenced).
	Record *Record
	// Drawer is the instance of this run whose grant the record names, or 0.
	Drawer int
	// Winners are the winner rows stored for the day, by user id.
	Winners []Winner
	// Draws is how many holders wrote winners for the day: more than one
	// means the draw is corrupt.
	Draws int
}

// Record says which grant drew a day: the token it drew under, its holder's
// mark (fence.HolderMark, as logs show it) and when.
type Record struct {
	Token      fence.Token
	HolderMark string
	Done       time.Time
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
	// Drew: the instance chose winners and its draw committed.
	Drew Outcome = iota + 1
	// FoundExisting: the instance found the day drawn.
	FoundExisting
	// RefusedStale: storage refused the instance's fence because a newer
	// holder had taken over; it drew nothing.
	RefusedStale
)

func (o Outcome) String() string {
	switch o {
	case Drew:
		return "drew"
	case FoundExisting:
		return "found the day drawn"
	case RefusedStale:
		return "refused as stale"
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
	// Chosen are the users the instance drew, if it drew.
	Chosen []int64
	// FoundBy is the token that had drawn the day, for FoundExisting.
	FoundBy fence.Token
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

// dayLayout is the -day format and the day's name in the lock's resource
// and the draw's key.
const dayLayout = "2006-01-02"

// drawKey names a day's draw, the work Once runs at most once.
func drawKey(day time.Time) string { return "lottery-draw:" + day.Format(dayLayout) }

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
	if c.Lock == "" {
		c.Lock = lockRedis
	}
	switch {
	case c.Store != storePostgres && c.Store != storePgsql && c.Store != storeMySQL:
		return c, fmt.Errorf("%w: store %q, want %q, %q or %q", errConfig, c.Store, storePostgres, storePgsql, storeMySQL)
	case (c.Store == storePostgres || c.Store == storePgsql) && c.PostgresURL == "":
		return c, fmt.Errorf("%w: empty PostgreSQL URL", errConfig)
	case c.Store == storeMySQL && c.MySQLDSN == "":
		return c, fmt.Errorf("%w: empty MySQL DSN", errConfig)
	case c.Lock != lockRedis && c.Lock != lockPostgres && c.Lock != lockMySQL:
		return c, fmt.Errorf("%w: lock %q, want %q, %q or %q", errConfig, c.Lock, lockRedis, lockPostgres, lockMySQL)
	case c.Lock == lockPostgres && c.Store == storeMySQL:
		return c, fmt.Errorf("%w: the PostgreSQL lock needs a PostgreSQL store (-store postgres or pgsql)", errConfig)
	case c.Lock == lockMySQL && c.Store != storeMySQL:
		return c, fmt.Errorf("%w: the MySQL lock needs the MySQL store (-store mysql)", errConfig)
	case c.Lock == lockRedis && c.Redis.Addr == "":
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
// database holds for the day. With the fence, the day's draw commits at most
// once, with winners from one holder, however the instances pause; a day
// that is already drawn is left unchanged. ctx bounds the whole run.
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
	if cfg.Lock == lockRedis {
		if err := pingRedis(ctx, cfg.Redis); err != nil {
			return Result{}, err
		}
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
	res := Result{Day: cfg.Day.Format(dayLayout), Key: drawKey(cfg.Day), Instances: make([]Instance, cfg.Instances)}
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
	if res.Record, res.Winners, err = db.readDay(ctx, cfg.Day); err != nil {
		return res, fmt.Errorf("lottery: read the day: %w", err)
	}
	tokens := map[fence.Token]bool{}
	for _, w := range res.Winners {
		tokens[w.Token] = true
	}
	res.Draws = len(tokens)
	for _, in := range res.Instances {
		if res.Record != nil && fence.HolderMark(in.Holder) == res.Record.HolderMark {
			res.Drawer = in.ID
		}
	}
	return res, nil
}

// The stores a run can record its draw in.
const (
	storePostgres = "postgres"
	storePgsql    = "pgsql"
	storeMySQL    = "mysql"

	lockRedis    = "redis"
	lockPostgres = "postgres"
	lockMySQL    = "mysql"
)

// store is the database a run records its draw in.
type store interface {
	// setup applies fencekit's migrations, creates the example's tables if
	// missing and seeds users; running it again changes nothing.
	setup(ctx context.Context, users int) error
	countUsers(ctx context.Context) (int, error)
	// readDay returns the day's completion record (nil if none) and every
	// winner row stored for the day.
	readDay(ctx context.Context, day time.Time) (*Record, []Winner, error)
	// instance opens the connections of one instance, as a separate
	// process would have its own.
	instance(ctx context.Context) (instanceStore, error)
	close()
}

// instanceStore is one instance's view of the store.
type instanceStore interface {
	// drawn is the check before drawing: the day's completion record
	// (LookupOnce) or, unfenced, the token of any winner row of the day.
	drawn(ctx context.Context, cfg Config) (rec Record, ok bool, err error)
	// draw chooses the winners and stores them with f's token: through Once
	// under f, which returns ran = false if the day's draw had committed,
	// or unfenced in a plain transaction.
	draw(ctx context.Context, cfg Config, f fence.Fence) (ran bool, chosen []int64, err error)
	close()
}

func openStore(ctx context.Context, cfg Config) (store, error) {
	switch cfg.Store {
	case storeMySQL:
		return connectMySQL(ctx, cfg.MySQLDSN)
	case storePgsql:
		return connectPgsql(ctx, cfg.PostgresURL)
	}
	return connectPostgres(ctx, cfg.PostgresURL)
}

func pingRedis(ctx context.Context, opt redis.Options) error {
	opt.DialTimeout = 2 * time.Second
	opt.MaxRetries = -1
	opt.ContextTimeoutEnabled = true
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
