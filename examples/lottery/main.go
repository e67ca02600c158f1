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
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("lottery", flag.ContinueOnError)
	fs.SetOutput(stderr)
	storeName := fs.String("store", storePostgres, "database to record the draw in: postgres or mysql")
	pgURL := fs.String("postgres", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL URL (with -store postgres)")
	myDSN := fs.String("mysql", "root@tcp(127.0.0.1:3306)/test", "MySQL or MariaDB DSN, user:password@tcp(host:port)/dbname (with -store mysql)")
	redisAddr := fs.String("redis", "127.0.0.1:6379", "Redis address host:port")
	instances := fs.Int("instances", 3, "instances racing for the draw")
	day := fs.String("day", time.Now().Format(dayLayout), "day to draw, YYYY-MM-DD")
	winners := fs.Int("winners", 5, "winners per draw")
	ttl := fs.Duration("ttl", 500*time.Millisecond, "lease of each instance's lock")
	pause := fs.Bool("pause", false, "make the first instance to win the lock pause past its lease before recording")
	unfenced := fs.Bool("unfenced", false, "use the lock alone, without fencing, to show the failure (draws a day of its own unless -day is given)")
	if err := fs.Parse(args); err != nil {
		return 2
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
	fmt.Fprintf(stdout, "lottery for %s on %s: %d instances, %d winners, lease %v, %s", *day, *storeName, *instances, *winners, *ttl, mode)
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

// report prints what each instance did and the day's recorded draw.
func report(w io.Writer, res Result) {
	fmt.Fprintln(w)
	for _, in := range res.Instances {
		line := fmt.Sprintf("instance %d: token %d: %s", in.ID, in.Token, in.Outcome)
		if in.Outcome == RefusedStale {
			line += fmt.Sprintf(" (lost to token %d)", in.HighWater.Token)
		}
		if in.Paused {
			line += ", after pausing past its lease"
		}
		fmt.Fprintln(w, line)
	}
	if res.Draws == 0 {
		fmt.Fprintf(w, "no draw recorded for %s\n", res.Day)
		return
	}
	d := res.Draw
	names := make([]string, len(d.Winners))
	tokens := map[int64]bool{}
	for i, win := range d.Winners {
		names[i] = fmt.Sprintf("%s (token %d)", win.Name, win.Token)
		tokens[int64(win.Token)] = true
	}
	fmt.Fprintf(w, "recorded draw for %s: token %d by instance %d at %s\n",
		res.Day, d.Token, d.Instance, d.DrawnAt.UTC().Format(time.RFC3339))
	fmt.Fprintf(w, "  %d winners: %s\n", len(d.Winners), strings.Join(names, ", "))
	if len(tokens) > 1 {
		fmt.Fprintf(w, "  the winners were written by %d different holders: the draw is corrupt\n", len(tokens))
	}
}
