package redis

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// The fenced benchmarks run against the same server as the plain GET and
// SET ones, so the ratio between them is the price of the guard: one EVALSHA
// doing admission, version and expiry checks against one plain command.

func benchValue() []byte { return []byte("0123456789abcdef0123456789abcdef") } // 32 bytes

func BenchmarkGetPlain(b *testing.B) {
	s, c := newStore(b)
	ctx := context.Background()
	key := s.Prefix() + "plain"
	if err := c.Set(ctx, key, benchValue(), 0).Err(); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Get(ctx, key).Bytes(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkGetFenced(b *testing.B) {
	s, _ := newStore(b)
	ctx := context.Background()
	f := fen(1, "bench")
	if err := s.Preload(ctx); err != nil {
		b.Fatal(err)
	}
	if _, err := s.FencedSet(ctx, f, "fenced", benchValue()); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.FencedGet(ctx, f, "fenced"); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSetPlain(b *testing.B) {
	s, c := newStore(b)
	ctx := context.Background()
	key, v := s.Prefix()+"plain", benchValue()
	b.ReportAllocs()
	for b.Loop() {
		if err := c.Set(ctx, key, v, 0).Err(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSetFenced(b *testing.B) {
	s, _ := newStore(b)
	ctx := context.Background()
	f, v := fen(1, "bench"), benchValue()
	if err := s.Preload(ctx); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.FencedSet(ctx, f, "fenced", v); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkUpdateFenced is a whole fenced read-modify-write: two round trips.
func BenchmarkUpdateFenced(b *testing.B) {
	s, _ := newStore(b)
	ctx := context.Background()
	f := fen(1, "bench")
	if err := s.Preload(ctx); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.FencedUpdate(ctx, f, "counter", func(old Value) ([]byte, error) {
			n, _ := strconv.Atoi(string(old.Data))
			return strconv.AppendInt(nil, int64(n+1), 10), nil
		}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSetPlainParallel and BenchmarkSetFencedParallel write distinct
// keys from parallel goroutines.
func BenchmarkSetPlainParallel(b *testing.B) {
	s, c := newStore(b)
	ctx := context.Background()
	v := benchValue()
	var next atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		key := s.Prefix() + "p" + strconv.FormatInt(next.Add(1), 10)
		for pb.Next() {
			if err := c.Set(ctx, key, v, 0).Err(); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func BenchmarkSetFencedParallel(b *testing.B) {
	s, _ := newStore(b)
	ctx := context.Background()
	f, v := fen(1, "bench"), benchValue()
	if err := s.Preload(ctx); err != nil {
		b.Fatal(err)
	}
	var next atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		key := "p" + strconv.FormatInt(next.Add(1), 10)
		for pb.Next() {
			if _, err := s.FencedSet(ctx, f, key, v); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkGetPaired and BenchmarkSetPaired alternate one plain command and
// one fenced operation on the same server and time each, so that both see
// the same machine load; they report both latencies and their ratio.
func BenchmarkGetPaired(b *testing.B) {
	s, c := newStore(b)
	ctx := context.Background()
	f, plainKey := fen(1, "bench"), s.Prefix()+"plain"
	if err := s.Preload(ctx); err != nil {
		b.Fatal(err)
	}
	if err := c.Set(ctx, plainKey, benchValue(), 0).Err(); err != nil {
		b.Fatal(err)
	}
	if _, err := s.FencedSet(ctx, f, "fenced", benchValue()); err != nil {
		b.Fatal(err)
	}
	paired(b,
		func() error { return c.Get(ctx, plainKey).Err() },
		func() error { _, err := s.FencedGet(ctx, f, "fenced"); return err })
}

func BenchmarkSetPaired(b *testing.B) {
	s, c := newStore(b)
	ctx := context.Background()
	f, plainKey, v := fen(1, "bench"), s.Prefix()+"plain", benchValue()
	if err := s.Preload(ctx); err != nil {
		b.Fatal(err)
	}
	paired(b,
		func() error { return c.Set(ctx, plainKey, v, 0).Err() },
		func() error { _, err := s.FencedSet(ctx, f, "fenced", v); return err })
}

func paired(b *testing.B, plain, fenced func() error) {
	var plainTime, fencedTime time.Duration
	n := 0
	for b.Loop() {
		t0 := time.Now()
		if err := plain(); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := fenced(); err != nil {
			b.Fatal(err)
		}
		plainTime += t1.Sub(t0)
		fencedTime += time.Since(t1)
		n++
	}
	b.ReportMetric(float64(plainTime.Nanoseconds())/float64(n), "plain-ns/op")
	b.ReportMetric(float64(fencedTime.Nanoseconds())/float64(n), "fenced-ns/op")
	b.ReportMetric(float64(fencedTime)/float64(plainTime), "fenced/plain")
}
