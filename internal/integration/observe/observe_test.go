package observe_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
	"github.com/fencekit/fencekit/migrations"
	"github.com/fencekit/fencekit/storage/postgres"
	fkredis "github.com/fencekit/fencekit/storage/redis"
)

// The SDK is installed as the global providers before any test runs, and
// every Locker and Store below is built with no telemetry option: what a
// service that installs an SDK gets by default.
var (
	reader = sdkmetric.NewManualReader()
	spans  = tracetest.NewSpanRecorder()
)

func TestMain(m *testing.M) {
	otel.SetMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)))
	os.Exit(m.Run())
}

// metrics reads every metric by name, from every instrumentation scope
// (fencekit.fence.rejections comes from both storage packages).
func metrics(t *testing.T) map[string][]metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string][]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = append(out[m.Name], m.Data)
		}
	}
	return out
}

func has(set attribute.Set, kv ...attribute.KeyValue) bool {
	for _, want := range kv {
		if v, ok := set.Value(want.Key); !ok || v != want.Value {
			return false
		}
	}
	return true
}

// count sums the data points of a counter or histogram (its count) whose
// attributes include kv.
func count(t *testing.T, name string, kv ...attribute.KeyValue) int64 {
	t.Helper()
	var n int64
	for _, data := range metrics(t)[name] {
		switch d := data.(type) {
		case metricdata.Sum[int64]:
			for _, p := range d.DataPoints {
				if has(p.Attributes, kv...) {
					n += p.Value
				}
			}
		case metricdata.Histogram[float64]:
			for _, p := range d.DataPoints {
				if has(p.Attributes, kv...) {
					n += int64(p.Count)
				}
			}
		default:
			t.Fatalf("%s: unexpected data %T", name, d)
		}
	}
	return n
}

// eventually polls until cond holds or fails after a generous deadline.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not seen within 10s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func outcome(o string) attribute.KeyValue { return attribute.String("outcome", o) }

func newLocker(t *testing.T) *lock.Locker {
	t.Helper()
	l, err := lock.New(testenv.Redis(t), lock.WithPrefix(testenv.Prefix(t)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l
}

// findSpan returns the last ended span named name whose attributes include kv.
func findSpan(t *testing.T, name string, kv ...attribute.KeyValue) sdktrace.ReadOnlySpan {
	t.Helper()
	ended := spans.Ended()
	for i := len(ended) - 1; i >= 0; i-- {
		s := ended[i]
		if s.Name() == name && has(attribute.NewSet(s.Attributes()...), kv...) {
			return s
		}
	}
	t.Fatalf("no ended span %s with %v", name, kv)
	return nil
}

func TestLockReportsAcquireHoldAndWaiters(t *testing.T) {
	ctx := context.Background()
	l := newLocker(t)
	res := "r-" + testenv.Prefix(t)
	acquired := count(t, "fencekit.lock.acquire.duration", outcome("acquired"))
	refused := count(t, "fencekit.lock.acquire.duration", outcome("not_acquired"))
	cancelled := count(t, "fencekit.lock.acquire.duration", outcome("cancelled"))
	holds := count(t, "fencekit.lock.hold.duration")

	lease, err := l.TryAcquire(ctx, res, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(ctx, res, time.Second); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("second TryAcquire = %v", err)
	}
	// A waiter shows in fencekit.lock.waiters while Acquire waits.
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	waited := make(chan error, 1)
	go func() { _, err := l.Acquire(short, res, time.Second); waited <- err }()
	eventually(t, "one waiter", func() bool { return count(t, "fencekit.lock.waiters") == 1 })
	if err := <-waited; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire under a held lock = %v", err)
	}
	if n := count(t, "fencekit.lock.waiters"); n != 0 {
		t.Fatalf("%d waiters after Acquire returned", n)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got := count(t, "fencekit.lock.acquire.duration", outcome("acquired")) - acquired; got != 1 {
		t.Errorf("acquired: %d measurements, want 1", got)
	}
	if got := count(t, "fencekit.lock.acquire.duration", outcome("not_acquired")) - refused; got != 1 {
		t.Errorf("not_acquired: %d measurements, want 1", got)
	}
	if got := count(t, "fencekit.lock.acquire.duration", outcome("cancelled")) - cancelled; got != 1 {
		t.Errorf("cancelled: %d measurements, want 1", got)
	}
	if got := count(t, "fencekit.lock.hold.duration") - holds; got != 1 {
		t.Errorf("hold: %d measurements, want 1", got)
	}
	// The resource and token are on the span, never on the metrics.
	s := findSpan(t, "fencekit.lock.try_acquire", attribute.String("fencekit.resource", res), outcome("acquired"))
	if !has(attribute.NewSet(s.Attributes()...), attribute.Int64("fencekit.token", int64(lease.Fence().Token))) {
		t.Errorf("acquire span attributes %v lack the token %d", s.Attributes(), lease.Fence().Token)
	}
	for _, name := range []string{"fencekit.lock.acquire.duration", "fencekit.lock.hold.duration"} {
		if n := count(t, name, attribute.String("fencekit.resource", res)); n != 0 {
			t.Errorf("%s carries the resource name as an attribute", name)
		}
	}
	findSpan(t, "fencekit.lock.release", attribute.String("fencekit.resource", res), outcome("ok"))
}

func TestLockReportsRenewalsAndLoss(t *testing.T) {
	ctx := context.Background()
	c := testenv.Redis(t)
	l, err := lock.New(c, lock.WithPrefix(testenv.Prefix(t)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	renewed := count(t, "fencekit.lock.renewals", outcome("renewed"))
	refused := count(t, "fencekit.lock.renewals", outcome("refused"))
	lost := count(t, "fencekit.lock.lost")

	lease, err := l.TryAcquire(ctx, "renewed", 150*time.Millisecond, lock.AutoRenew())
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "a renewal", func() bool { return count(t, "fencekit.lock.renewals", outcome("renewed")) > renewed })
	c.Del(ctx, keysOf(l).LockKey("renewed")) // behind the holder's back
	select {
	case <-lease.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done did not close after the key was deleted")
	}
	// Done closes inside the refused renewal call, just before the renewal
	// loop records its outcome.
	eventually(t, "one refused renewal", func() bool {
		return count(t, "fencekit.lock.renewals", outcome("refused"))-refused == 1
	})
	if got := count(t, "fencekit.lock.lost") - lost; got != 1 {
		t.Errorf("lost leases: %d, want 1", got)
	}
	// A release that ends a lease normally is no loss.
	other, err := l.TryAcquire(ctx, "released", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got := count(t, "fencekit.lock.lost") - lost; got != 1 {
		t.Errorf("lost leases after a release: %d, want still 1", got)
	}
}

// staleFences returns an older and a newer fence of one resource.
func staleFences(resource string) (older, newer fence.Fence) {
	return fence.Fence{Resource: resource, Token: 5, Holder: "old"}, fence.Fence{Resource: resource, Token: 6, Holder: "new"}
}

func TestRedisStoreCountsRejections(t *testing.T) {
	ctx := context.Background()
	store, err := fkredis.New(testenv.Redis(t), fkredis.WithPrefix(testenv.Prefix(t)))
	if err != nil {
		t.Fatal(err)
	}
	stale := []attribute.KeyValue{attribute.String("storage", "redis"), attribute.String("reason", "stale")}
	conflict := []attribute.KeyValue{attribute.String("storage", "redis"), attribute.String("reason", "conflict")}
	mismatch := []attribute.KeyValue{attribute.String("storage", "redis"), attribute.String("reason", "resource_mismatch")}
	before := [3]int64{count(t, "fencekit.fence.rejections", stale...), count(t, "fencekit.fence.rejections", conflict...), count(t, "fencekit.fence.rejections", mismatch...)}

	older, newer := staleFences("acct")
	if _, err := store.FencedGet(ctx, newer, "k"); !errors.Is(err, fence.ErrNotFound) {
		t.Fatal(err)
	}
	if _, err := store.FencedSet(ctx, older, "k", []byte("x")); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("stale Set = %v", err)
	}
	if _, err := store.CompareAndSet(ctx, "v", 7, []byte("x")); !errors.Is(err, fence.ErrConflict) {
		t.Fatalf("CompareAndSet with a wrong version = %v", err)
	}
	if _, err := store.FencedSet(ctx, fence.Fence{Resource: "other", Token: 9, Holder: "h"}, "k", []byte("x")); !errors.Is(err, fkredis.ErrResourceMismatch) {
		t.Fatalf("Set for another resource = %v", err)
	}
	after := [3]int64{count(t, "fencekit.fence.rejections", stale...), count(t, "fencekit.fence.rejections", conflict...), count(t, "fencekit.fence.rejections", mismatch...)}
	if after[0]-before[0] != 1 || after[1]-before[1] != 1 || after[2]-before[2] != 1 {
		t.Fatalf("rejections stale/conflict/resource_mismatch went %v -> %v, want one more each", before, after)
	}
	s := findSpan(t, "fencekit.redis.set", attribute.String("fencekit.resource", "acct"), outcome("stale"))
	if s.Status().Code != codes.Error || len(s.Events()) == 0 {
		t.Fatalf("refused write's span: status %v, events %v; want an error with the refusal recorded", s.Status(), s.Events())
	}
	findSpan(t, "fencekit.redis.get", attribute.String("fencekit.key", "k"))
}

func TestPostgresCountsRejections(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	if err := migrations.UpPool(ctx, pool); err != nil {
		t.Fatal(err)
	}
	stale := []attribute.KeyValue{attribute.String("storage", "postgres"), attribute.String("reason", "stale")}
	before := count(t, "fencekit.fence.rejections", stale...)
	older, newer := staleFences("acct-" + testenv.Prefix(t))
	if _, err := postgres.Exec(ctx, pool, newer); err != nil {
		t.Fatal(err)
	}
	if _, err := postgres.Exec(ctx, pool, older); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("stale Exec = %v", err)
	}
	err := postgres.InTx(ctx, pool, pgx.TxOptions{}, older, func(context.Context, pgx.Tx) error { return nil })
	if !errors.Is(err, fence.ErrStale) {
		t.Fatalf("stale InTx = %v", err)
	}
	if got := count(t, "fencekit.fence.rejections", stale...) - before; got != 2 {
		t.Fatalf("postgres stale rejections: %d more, want 2", got)
	}
	s := findSpan(t, "fencekit.postgres.exec", attribute.String("fencekit.resource", older.Resource), outcome("stale"))
	if s.Status().Code != codes.Error || len(s.Events()) == 0 {
		t.Fatalf("refused Exec's span: status %v, events %v", s.Status(), s.Events())
	}
	findSpan(t, "fencekit.postgres.exec", attribute.String("fencekit.resource", newer.Resource), outcome("ok"))
}

// Options send a Locker's and a Store's telemetry to providers other than
// the global ones.
func TestProvidersByOption(t *testing.T) {
	ctx := context.Background()
	own := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(own))
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	l, err := lock.New(testenv.Redis(t), lock.WithPrefix(testenv.Prefix(t)), lock.WithMeterProvider(mp), lock.WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	lease, err := l.TryAcquire(ctx, "r", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var rm metricdata.ResourceMetrics
	if err := own.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			names[m.Name] = true
		}
	}
	if !names["fencekit.lock.acquire.duration"] || !names["fencekit.lock.hold.duration"] {
		t.Fatalf("own meter provider saw %v", names)
	}
	if len(rec.Ended()) != 2 {
		t.Fatalf("own tracer provider saw %d spans, want 2 (acquire, release)", len(rec.Ended()))
	}
	if _, err := lock.New(testenv.Redis(t), lock.WithMeterProvider(nil)); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("WithMeterProvider(nil) = %v", err)
	}
	if _, err := fkredis.New(testenv.Redis(t), fkredis.WithTracerProvider(nil)); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("fkredis.WithTracerProvider(nil) = %v", err)
	}
}

// A grant that finds no token state counts as a miss: the first grant of a
// resource, and the first after Redis lost the state. Grants that find it
// do not.
func TestLockCountsTokenStateMisses(t *testing.T) {
	ctx := context.Background()
	c := testenv.Redis(t)
	l, err := lock.New(c, lock.WithPrefix(testenv.Prefix(t)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	grant := func(opts ...lock.AcquireOption) {
		t.Helper()
		lease, err := l.TryAcquire(ctx, "r", time.Second, opts...)
		if err != nil {
			t.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	before := count(t, "fencekit.lock.token_state.misses")
	grant()
	if got := count(t, "fencekit.lock.token_state.misses") - before; got != 1 {
		t.Fatalf("first grant: %d misses, want 1", got)
	}
	grant()
	grant(lock.Owner("job-1"))
	if got := count(t, "fencekit.lock.token_state.misses") - before; got != 1 {
		t.Fatalf("grants that found the state: %d misses in all, want still 1", got)
	}
	c.Del(ctx, keysOf(l).TokenKey("r")) // as a FLUSHALL or a failover would
	grant(lock.Owner("job-1"))
	if got := count(t, "fencekit.lock.token_state.misses") - before; got != 2 {
		t.Fatalf("grant after the state was lost: %d misses in all, want 2", got)
	}
}
