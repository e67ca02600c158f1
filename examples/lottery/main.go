package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/examples/internal/cli"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("lottery", flag.ContinueOnError)
	fs.SetOutput(stderr)
	storeName := fs.String("store", storePostgres, "database to record the draw in: postgres (pgx), pgsql (PostgreSQL through database/sql) or mysql")
	pgURL := fs.String("postgres", "postgres://postgres@127.0.0.1:5432/test", "PostgreSQL URL (with -store postgres or pgsql)")
	myDSN := fs.String("mysql", "root@tcp(127.0.0.1:3306)/test", "MySQL or MariaDB DSN, user:password@tcp(host:port)/dbname (with -store mysql)")
	lockName := fs.String("lock", lockRedis, "where to take the lock: redis, postgres (in the -postgres database, no Redis; -store postgres or pgsql) or mysql (in the -mysql database, no Redis; -store mysql)")
	redisAddr := fs.String("redis", "127.0.0.1:6379", "Redis address host:port (with -lock redis)")
	instances := fs.Int("instances", 3, "instances racing for the draw")
	day := fs.String("day", time.Now().Format(dayLayout), "day to draw, YYYY-MM-DD")
	winners := fs.Int("winners", 5, "winners per draw")
	ttl := fs.Duration("ttl", 500*time.Millisecond, "lease of each instance's lock")
	pause := fs.Bool("pause", false, "make the first instance to win the lock pause past its lease before drawing")
	unfenced := fs.Bool("unfenced", false, "use the lock alone, without fence or completion record, to show the failure (draws a day of its own unless -day is given)")
	if done, code := cli.Parse(fs, "lottery", "instances racing to draw a day's winners, once, though the first lock winner pauses past its lease (-unfenced: the lock alone draws twice)", args); done {
		return code
	}
	d, err := time.Parse(dayLayout, *day)
	if err != nil {
		fmt.Fprintf(stderr, "lottery: -day %q is not a date of the form YYYY-MM-DD\n", *day)
		return 2
	}
	daySet := false
	fs.Visit(func(f *flag.Flag) { daySet = daySet || f.Name == "day" })
	if *unfenced && !daySet {
		// Today is most likely drawn already (by an earlier run), and a day
		// that is drawn is left alone, so the lock alone would have nothing
		// to get wrong. Draw a day of this run's own instead.
		d = time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC).AddDate(0, 0, rand.IntN(365*100))
		*day = d.Format(dayLayout)
		fmt.Fprintf(stdout, "-unfenced draws a day no earlier run has drawn, %s, since a drawn day is left alone (-day picks one)\n", *day)
	}
	cfg := Config{
		Store:       *storeName,
		Lock:        *lockName,
		PostgresURL: *pgURL,
		MySQLDSN:    *myDSN,
		Redis:       redis.Options{Addr: *redisAddr},
		Day:         d,
		Instances:   *instances,
		Winners:     *winners,
		TTL:         *ttl,
		Pause:       *pause,
		Unfenced:    *unfenced,
		Log:         stdout,
	}
	mode := "fenced"
	if *unfenced {
		mode = "lock alone, unfenced"
	}
	fmt.Fprintf(stdout, "lottery for %s on %s, lock on %s: %d instances, %d winners, lease %v, %s", *day, *storeName, *lockName, *instances, *winners, *ttl, mode)
	if *pause {
		fmt.Fprint(stdout, ", forced pause")
	}
	fmt.Fprintln(stdout)

	res, err := Draw(ctx, cfg)
	var unreachable *unreachableError
	switch {
	case errors.As(err, &unreachable), errors.Is(err, errConfig):
		fmt.Fprintln(stderr, "lottery:", err)
		return 2
	case err != nil:
		fmt.Fprintln(stderr, "lottery:", err)
		return 1
	}
	report(stdout, res)
	return 0
}

// report prints what each instance did and what the day holds.
func report(w io.Writer, res Result) {
	fmt.Fprintln(w)
	for _, in := range res.Instances {
		line := fmt.Sprintf("instance %d: token %d: %s", in.ID, in.Token, in.Outcome)
		switch in.Outcome {
		case FoundExisting:
			line += fmt.Sprintf(" by token %d", in.FoundBy)
		case RefusedStale:
			line += fmt.Sprintf(" (lost to token %d)", in.HighWater.Token)
		}
		if in.Paused {
			line += ", after pausing past its lease"
		}
		fmt.Fprintln(w, line)
	}
	if rec := res.Record; rec != nil {
		by := "an earlier run"
		if res.Drawer != 0 {
			by = fmt.Sprintf("instance %d", res.Drawer)
		}
		fmt.Fprintf(w, "completion record %s: token %d (%s) at %s\n",
			res.Key, rec.Token, by, rec.Done.UTC().Format(time.RFC3339))
	}
	if len(res.Winners) == 0 {
		fmt.Fprintf(w, "no winners stored for %s\n", res.Day)
		return
	}
	names := make([]string, len(res.Winners))
	for i, win := range res.Winners {
		names[i] = fmt.Sprintf("%s (token %d)", win.Name, win.Token)
	}
	fmt.Fprintf(w, "%d winners stored for %s: %s\n", len(res.Winners), res.Day, strings.Join(names, ", "))
	if res.Draws > 1 {
		fmt.Fprintf(w, "  the winners were drawn by %d different holders: the draw is corrupt\n", res.Draws)
	}
}
