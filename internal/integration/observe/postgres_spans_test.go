package observe_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/migrations"
	"github.com/fencekit/fencekit/storage/postgres"
)

// A guard_all span names its resources and tokens, in the order the guard
// rows are locked, as the other spans name their one fence; no holder id
// reaches its attributes or its events, admitted or refused.
func TestPostgresGuardAllSpanNamesResourcesAndTokens(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	if err := migrations.UpPool(ctx, pool); err != nil {
		t.Fatal(err)
	}
	p := testenv.Prefix(t)
	a := fence.Fence{Resource: p + "-a", Token: 7, Holder: "holder-secret-a-" + p}
	b := fence.Fence{Resource: p + "-b", Token: 9, Holder: "holder-secret-b-" + p}
	guardAll := func(fences ...fence.Fence) error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if err := postgres.GuardAll(ctx, tx, fences...); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	if err := guardAll(b, a); err != nil {
		t.Fatal(err)
	}
	resources := attribute.StringSlice("fencekit.resource", []string{a.Resource, b.Resource})
	s := findSpan(t, "fencekit.postgres.guard_all", resources, attribute.Int64Slice("fencekit.token", []int64{7, 9}), outcome("ok"))
	checkNoHolder(t, s.Name(), fmt.Sprint(s.Attributes(), s.Events()), a.Holder, b.Holder)

	older := fence.Fence{Resource: a.Resource, Token: 3, Holder: "holder-secret-c-" + p}
	if err := guardAll(older, b); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("stale GuardAll = %v", err)
	}
	s = findSpan(t, "fencekit.postgres.guard_all", resources, attribute.Int64Slice("fencekit.token", []int64{3, 9}), outcome("stale"))
	checkNoHolder(t, s.Name(), fmt.Sprint(s.Attributes(), s.Events()), a.Holder, b.Holder, older.Holder)
}

func checkNoHolder(t *testing.T, span, text string, holders ...string) {
	t.Helper()
	for _, h := range holders {
		if strings.Contains(text, h) {
			t.Errorf("span %s carries holder id %q: %s", span, h, text)
		}
	}
}

// A once span names the fence's resource and token, the key, and whether
// this call ran the work; no holder id.
func TestPostgresOnceSpan(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	if err := migrations.UpPool(ctx, pool); err != nil {
		t.Fatal(err)
	}
	p := testenv.Prefix(t)
	f := fence.Fence{Resource: p + "-job", Token: 4, Holder: "holder-secret-" + p}
	key := "daily:" + p
	nop := func(context.Context, pgx.Tx) error { return nil }
	for _, want := range []bool{true, false} {
		ran, err := postgres.Once(ctx, pool, f, key, nop)
		if err != nil || ran != want {
			t.Fatalf("Once = %v, %v; want %v", ran, err, want)
		}
		s := findSpan(t, "fencekit.postgres.once", attribute.String("fencekit.resource", f.Resource),
			attribute.Int64("fencekit.token", 4), attribute.String("fencekit.key", key),
			attribute.Bool("fencekit.once.ran", want), outcome("ok"))
		checkNoHolder(t, s.Name(), fmt.Sprint(s.Attributes(), s.Events()), f.Holder)
	}
}
