// Package late_test checks the lock's telemetry in a program that installs
// an OpenTelemetry SDK as the global providers only after it made its
// Locker: until then the Locker skips its no-op spans and measurements, and
// from then on it must record. It is a package of its own because the
// global providers are process-wide.
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

	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
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
	grant() // no SDK yet: nothing to record

	reader := sdkmetric.NewManualReader()
	spans := tracetest.NewSpanRecorder()
	otel.SetMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)))
	grant()

	names := map[string]int{}
	for _, s := range spans.Ended() {
		names[s.Name()]++
	}
	if names["fencekit.lock.try_acquire"] != 1 || names["fencekit.lock.release"] != 1 {
		t.Fatalf("spans after the SDK was installed: %v; want one try_acquire and one release", names)
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
