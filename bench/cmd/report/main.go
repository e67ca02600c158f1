// Command report runs the benchmark suite and writes REPORT.md and its
// charts: fencekit against bsm/redislock, redsync and rueidislock, and
// against plain commands, with every ratio taken from the same run.
//
// It starts a private redis-server (which must be on PATH) and uses a
// schema of its own in the PostgreSQL at -postgres.
//
//	go run ./cmd/report          # in bench/: the full run (about 10 minutes), writes bench/REPORT.md
//	go run ./cmd/report -quick   # seconds; writes to a temporary directory unless -out is given
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"

	"github.com/fencekit/fencekit/bench/internal/report"
	"github.com/fencekit/fencekit/bench/internal/suite"
)

func main() {
	quick := flag.Bool("quick", false, "a run of seconds that exercises every part")
	out := flag.String("out", "", "directory for REPORT.md and charts/ (default: the bench module's directory; a temporary one with -quick)")
	pg := flag.String("postgres", defaultPostgres(), "PostgreSQL URL; empty skips the PostgreSQL comparison")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	memprofile := flag.String("memprofile", "", "write an allocation profile of the whole run to this file")
	from := flag.String("from", "", "render the results.json of an earlier run instead of measuring")
	flag.Parse()
	log.SetFlags(0)

	cfg := suite.Full()
	command := "go run ./cmd/report"
	if *quick {
		cfg = suite.Quick()
		command += " -quick"
	}
	cfg.PostgresURL = *pg
	cfg.Log = os.Stderr
	dir := *out
	if dir == "" {
		if *quick {
			dir = filepath.Join(os.TempDir(), "fencekit-bench-quick")
		} else {
			dir = moduleDir()
		}
	}
	if *memprofile != "" {
		runtime.MemProfileRate = 4096
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			log.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var r *suite.Results
	var err error
	if *from != "" {
		r, err = load(*from)
	} else {
		r, err = suite.Run(ctx, cfg)
	}
	if err != nil {
		log.Fatal(err)
	}
	if *memprofile != "" {
		f, err := os.Create(*memprofile)
		if err != nil {
			log.Fatal(err)
		}
		if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
			log.Fatal(err)
		}
		f.Close()
	}
	if err := report.Write(dir, r, command); err != nil {
		log.Fatal(err)
	}
	if err := save(filepath.Join(dir, "results.json"), r); err != nil {
		log.Fatal(err)
	}
	for _, t := range report.Targets(r) {
		met := "MISSED"
		if t.Met {
			met = "met"
		}
		fmt.Printf("%-6s  %s: %s: %s\n", met, t.What, t.Goal, t.Measured)
	}
	fmt.Printf("wrote %s\n", filepath.Join(dir, "REPORT.md"))
}

// defaultPostgres is the URL the repository's tests use.
func defaultPostgres() string {
	if u := os.Getenv("FENCEKIT_TEST_POSTGRES"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// moduleDir is the bench module's directory, whether the command runs from
// it or from the repository root.
func moduleDir() string {
	if _, err := os.Stat(filepath.Join("bench", "cmd", "report")); err == nil {
		return "bench"
	}
	return "."
}

// save keeps the raw results next to the report, for -from.
func save(path string, r *suite.Results) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

func load(path string) (*suite.Results, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	r := new(suite.Results)
	return r, json.Unmarshal(b, r)
}
