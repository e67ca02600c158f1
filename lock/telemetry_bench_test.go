package lock

import (
	"context"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/harness/testenv"
)

// BenchmarkInstrumentsOverhead alternates TryAcquire + Release on a Locker
// with its default instruments (the global OpenTelemetry providers, with no
// SDK installed: no-ops) and on the same Locker with the instruments
// removed, and reports both and their ratio. It is what a program that
// never installs an SDK pays for the instruments.
func BenchmarkInstrumentsOverhead(b *testing.B) {
	ctx := context.Background()
	c := testenv.Redis(b)
	prefix := testenv.Prefix(b)
	with, err := New(c, WithPrefix(prefix))
	if err != nil {
		b.Fatal(err)
	}
	without, err := New(c, WithPrefix(prefix))
	if err != nil {
		b.Fatal(err)
	}
	without.tel = nil
	var withNs, withoutNs time.Duration
	run := func(l *Locker) time.Duration {
		t0 := time.Now()
		lease, err := l.TryAcquire(ctx, "bench", time.Second)
		if err != nil {
			b.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	run(with) // loads the scripts
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if i%2 == 0 {
			withNs += run(with)
			withoutNs += run(without)
		} else {
			withoutNs += run(without)
			withNs += run(with)
		}
	}
	b.ReportMetric(float64(withNs.Nanoseconds())/float64(b.N), "instrumented-ns/op")
	b.ReportMetric(float64(withoutNs.Nanoseconds())/float64(b.N), "bare-ns/op")
	b.ReportMetric(float64(withNs)/float64(withoutNs), "instrumented/bare")
}

// BenchmarkInstrumentsOnly measures the instruments alone, with no Redis: a
// span and the acquire and hold metrics per grant, on the default global
// providers with no SDK installed, which the instruments skip.
func BenchmarkInstrumentsOnly(b *testing.B) {
	cfg := config{}
	in, err := cfg.instruments()
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	lease := &Lease{}
	b.ReportAllocs()
	for b.Loop() {
		start := time.Now()
		c, span := in.startAcquire(ctx, "fencekit.lock.try_acquire", "bench", false)
		in.endAcquire(c, span, start, false, lease, nil)
		_, span = in.startLeaseOp(ctx, "fencekit.lock.release", lease.f)
		in.endLeaseOp(span, nil)
		in.ended(start, releasedError{})
	}
}
