package testenv

import (
	"context"
	"math/rand/v2"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

const postgresHow = "start PostgreSQL on 127.0.0.1:5432 with a database named test, set FENCEKIT_TEST_POSTGRES=postgres://user@host:port/db, or run a Docker engine"

var sharedPostgres struct {
	once sync.Once
	url  string
	err  error
}

// PostgresBaseURL returns the URL of the shared PostgreSQL database, skipping
// (or failing) t when none can be had. Most tests want [PostgresURL] instead,
// which isolates them in a schema of their own.
func PostgresBaseURL(t testing.TB) string {
	t.Helper()
	sharedPostgres.once.Do(func() {
		sharedPostgres.url, sharedPostgres.err = findPostgres()
	})
	if sharedPostgres.err != nil {
		unavailable(t, "PostgreSQL", postgresHow, sharedPostgres.err)
	}
	return sharedPostgres.url
}

// PostgresURL creates a schema unique to t, drops it when t ends, and returns
// a URL whose connections use it as their search_path. Tables, migrations and
// guard rows a test creates there are invisible to every other test.
func PostgresURL(t testing.TB) string {
	t.Helper()
	base := PostgresBaseURL(t)
	schema := "fktest_" + randomID()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatalf("testenv: connect: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatalf("testenv: create schema: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Logf("testenv: drop schema %s: %v", schema, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Logf("testenv: drop schema %s: %v", schema, err)
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("testenv: bad PostgreSQL URL: %v", err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// Postgres returns a pool whose connections work in a schema unique to t
// (see [PostgresURL]); the pool is closed and the schema dropped when t ends.
func Postgres(t testing.TB) *pgxpool.Pool {
	t.Helper()
	u := PostgresURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, u)
	if err != nil {
		t.Fatalf("testenv: pool: %v", err)
	}
	t.Cleanup(pool.Close) // registered after the schema drop, so it runs first
	return pool
}

func findPostgres() (string, error) {
	return findServer("postgres", "FENCEKIT_TEST_POSTGRES", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", pingPostgres)
}

func pingPostgres(u string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.Ping(ctx)
}

// PostgresDatabase creates a database of its own, named prefix and a random
// suffix, on the server of base (the URL of any of its databases), for a
// test that must change what a database holds for every session (its
// functions, its triggers), which a schema of its own cannot keep from the
// other packages' tests. It returns the new database's URL and what drops it
// (its sessions forced out); the caller says when that runs.
func PostgresDatabase(t testing.TB, base, prefix string) (dbURL string, drop func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := prefix + strconv.FormatUint(rand.Uint64(), 36)
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatalf("testenv: connect to create database %s: %v", name, err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("testenv: create database %s: %v", name, err)
	}
	drop = func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Logf("testenv: drop database %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Logf("testenv: drop database %s: %v", name, err)
		}
	}
	u, err := url.Parse(base)
	if err != nil {
		drop()
		t.Fatal(err)
	}
	u.Path = "/" + name
	q := u.Query()
	q.Del("search_path")
	u.RawQuery = q.Encode()
	return u.String(), drop
}
