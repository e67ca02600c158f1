package pglock

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"

	"github.com/fencekit/fencekit/internal/telemetry"
)

// ListenerFailures is the counter of the LISTEN connection's failures: a
// connect or LISTEN that failed (waiters poll until it succeeds), or a
// connection that went silent and was replaced. The same failures are
// logged at warning level on slog's default logger, at most once every
// listenerLogEvery.
const ListenerFailures = "fencekit.pglock.listener.failures"

// listenerLogEvery bounds how often listener failures are logged.
const listenerLogEvery = 30 * time.Second

// listenerReporter returns what the listener calls with each failure: a
// count on mp (nil: the global provider) and a rate-limited warning.
func listenerReporter(mp metric.MeterProvider) func(error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	counter, err := mp.Meter(telemetry.ScopePrefix+"lock/pglock").Int64Counter(ListenerFailures,
		metric.WithUnit("{failure}"),
		metric.WithDescription("Failures of the PostgreSQL lock's LISTEN connection: a connect that failed, or a connection gone silent and replaced."))
	if err != nil {
		counter = nil
	}
	var (
		mu       sync.Mutex
		last     time.Time
		withheld int
	)
	return func(err error) {
		if counter != nil {
			counter.Add(context.Background(), 1)
		}
		mu.Lock()
		defer mu.Unlock()
		if !last.IsZero() && time.Since(last) < listenerLogEvery {
			withheld++
			return
		}
		slog.Warn(err.Error(), "failures_not_logged", withheld)
		last, withheld = time.Now(), 0
	}
}
