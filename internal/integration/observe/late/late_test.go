// Package late_test checks the lock's telemetry in a program that installs
// an OpenTelemetry SDK as the global providers only after it made its
// Locker: until then the Locker skips its no-op spans and measurements, and
// from then on it must record. The SQL adapters' calls likewise skip their
// no-op spans until then, and record from then on. It is a package of its
// own because the global providers are process-wide.
package late_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
	"github.com/fencekit/fencekit/migrations"
	"github.com/fencekit/fencekit/storage/postgres"
)

func TestLockerMadeBeforeTheSDKRecordsOnceItIsInstalled(t *testing.T) {
	ctx := context.Background()
	l, err := lock.New(testenv.Redis(t), lock.WithPrefix(testenv.Prefix(t)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	grant := func() {
		t.Helper()
		lease, err := l.TryAcquire(ctx, "late", time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	pool := testenv.Postgres(t)
	if err := migrations.UpPool(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE accounts (id bigint PRIMARY KEY, balance bigint NOT NULL, fence_token bigint, fence_holder text)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO accounts (id, balance) VALUES (1, 0)`); err != nil {
		t.Fatal(err)
	}
	tbl := postgres.Table{Name: pgx.Identifier{"accounts"}, Key: "id"}
	write := func(n int64) {
		t.Helper()
		f := fence.Fence{Resource: "late", Token: 1, Holder: "h"}
		if err := tbl.Update(ctx, pool, f, 1, postgres.Set("balance", n)); err != nil {
			t.Fatal(err)
		}
		if err := postgres.InTx(ctx, pool, pgx.TxOptions{}, f, func(ctx context.Context, tx pgx.Tx) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}

	grant() // no SDK yet: nothing to record
	write(1)

	reader := sdkmetric.NewManualReader()
	spans := tracetest.NewSpanRecorder()
	otel.SetMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)))
	grant()
	write(2)

	names := map[string]int{}
	for _, s := range spans.Ended() {
		names[s.Name()]++
	}
	if names["fencekit.lock.try_acquire"] != 1 || names["fencekit.lock.release"] != 1 {
		t.Fatalf("spans after the SDK was installed: %v; want one try_acquire and one release", names)
	}
	if names["fencekit.postgres.table_update"] != 1 || names["fencekit.postgres.in_tx"] != 1 {
		t.Fatalf("spans after the SDK was installed: %v; want one table_update and one in_tx", names)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	counts := map[string]uint64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if h, ok := m.Data.(metricdata.Histogram[float64]); ok {
				for _, p := range h.DataPoints {
					counts[m.Name] += p.Count
				}
			}
		}
	}
	for _, name := range []string{"fencekit.lock.acquire.duration", "fencekit.lock.hold.duration"} {
		if counts[name] != 1 {
			t.Errorf("%s: %d measurements, want the one made after the SDK was installed", name, counts[name])
		}
	}
}
