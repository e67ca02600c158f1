package lock

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock/internal/redisbackend"
	"github.com/redis/go-redis/v9"
)

// Two earlier readers of the release channel, as their code read messages
// (not this package's current parsers): a rolling upgrade runs them beside
// this release, on the same channels.

// readerBeforeQueueNews is a waiter's reading of a message before the
// scripts announced the first waiters: a message that parses as a grant
// "<holder> <token> <refreshed µs> <age ms>" goes to its holder (nobody,
// for a holder id that is not a waiter's); anything else means "the lock is
// free" and wakes one waiter, which tries at once.
func readerBeforeQueueNews(payload string) (wakes bool) {
	_, rest, ok1 := strings.Cut(payload, " ")
	tok, rest, ok2 := strings.Cut(rest, " ")
	ref, age, ok3 := strings.Cut(rest, " ")
	if !ok1 || !ok2 || !ok3 {
		return true
	}
	token, err1 := strconv.ParseInt(tok, 10, 64)
	_, err2 := strconv.ParseInt(ref, 10, 64)
	ms, err3 := strconv.ParseInt(age, 10, 64)
	return err1 != nil || err2 != nil || err3 != nil || token < 1 || ms < 0 || ms > math.MaxInt64/int64(time.Millisecond)
}

// readerOfPlainNews is the first release that read announcements,
// "q:<remaining ms>:<first>[:<second>[:<third>]]", before any grant: it
// returns the waiters it reads as named (ok false when it did not read the
// message as an announcement).
func readerOfPlainNews(payload string) (first []string, ok bool) {
	rest, ok := strings.CutPrefix(payload, "q:")
	if !ok {
		return nil, false
	}
	ms, rest, ok := strings.Cut(rest, ":")
	if !ok {
		return nil, false
	}
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil || n < -2 || n > math.MaxInt64/int64(time.Millisecond) {
		return nil, false
	}
	return strings.SplitN(rest, ":", namedPlaces), true
}

// The scripts' announcements of the first waiters are harmless to the
// releases before them: the one that knew only grants (and read any other
// message as "the lock is free", waking a waiter to try on every
// announcement: with 16 such processes beside 16 of this release, 10.1
// script calls per grant against 2.0) takes each for a grant to nobody, and
// the one that read plain announcements still reads every named waiter but
// the third. It also measures the broadcast: what every grant costs each
// subscribed Locker.
//
// Every grant from the queue of a lease shorter than a queue refresh (the
// leases here) publishes two messages, the grant and the announcement of the
// new first waiters, and each reaches every Locker subscribed to the
// channel: draining n waiters of n Lockers costs about
// 2n² deliveries (the grant alone, before announcements: n²). The second
// run drains 128 waiters of 128 Lockers, one grant each, and measures it
// (about 255 deliveries per grant).
func TestAnnouncementsLeaveEarlierReadersAlone(t *testing.T) {
	testenv.Slow(t)
	t.Run("4x3", func(t *testing.T) { testAnnouncements(t, 4, 3, 60) })
	t.Run("128x1", func(t *testing.T) { testAnnouncements(t, 128, 1, 128) })
}

func testAnnouncements(t *testing.T, lockers, perLocker int, grantsTotal int64) {
	const resource = "upgrade"
	ctx := context.Background()
	prefix := testenv.Prefix(t)
	var ls []*Locker
	for range lockers {
		l, err := New(testenv.Redis(t), WithPrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(l.Close)
		ls = append(ls, l)
	}
	sub := testenv.Redis(t).Subscribe(ctx, keysOf(ls[0]).ReleaseChannel(resource))
	t.Cleanup(func() { _ = sub.Close() })
	if _, err := sub.Receive(ctx); err != nil { // the confirmation
		t.Fatal(err)
	}
	var (
		mu       sync.Mutex
		payloads []string
		recvDone = make(chan struct{})
	)
	go func() {
		defer close(recvDone)
		for {
			msg, err := sub.Receive(ctx)
			if err != nil {
				return
			}
			if m, ok := msg.(*redis.Message); ok {
				mu.Lock()
				payloads = append(payloads, m.Payload)
				mu.Unlock()
			}
		}
	}()

	var grants atomic.Int64
	var wg sync.WaitGroup
	for _, l := range ls {
		for range perLocker {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for grants.Load() < grantsTotal {
					// Each waits for up to every other one's turn: on a
					// loaded machine under -race, 128 turns took over 10 s.
					actx, cancel := context.WithTimeout(ctx, 2*time.Minute)
					// Under a second: a grant of a longer lease from the
					// queue announces nothing (its waiters learn their
					// places from their refreshes).
					lease, err := l.Acquire(actx, resource, 900*time.Millisecond)
					cancel()
					if err != nil {
						t.Error(err)
						return
					}
					grants.Add(1)
					time.Sleep(2 * time.Millisecond)
					// A lease that ran out while the machine stalled is
					// not what this test is about.
					if err := lease.Release(ctx); err != nil && !errors.Is(err, ErrNotHeld) {
						t.Error(err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	time.Sleep(200 * time.Millisecond) // the last messages
	_ = sub.Close()
	<-recvDone
	mu.Lock()
	defer mu.Unlock()

	var handed, news, wakes, lostNames, names int
	for _, p := range payloads {
		if !strings.HasPrefix(p, "q:") {
			if !readerBeforeQueueNews(p) {
				handed++
			}
			continue
		}
		news++
		if readerBeforeQueueNews(p) {
			wakes++
		}
		_, now, ok := redisbackend.ParsePlaces(p)
		if !ok {
			t.Fatalf("this release does not read its own announcement %q", p)
		}
		before, ok := readerOfPlainNews(p)
		if !ok {
			t.Fatalf("the release that read plain announcements does not read %q", p)
		}
		for i, h := range now {
			names++
			if i >= len(before) || before[i] != h {
				lostNames++
				if i < namedPlaces-1 {
					t.Errorf("the release that read plain announcements misreads waiter %d of %q: %q", i, p, before)
				}
			}
		}
	}
	n := grants.Load()
	t.Logf("%d grants, %d handed over from the queue, %d announcements: %.2f messages per grant, each delivered to every subscribed Locker (%d here: %.1f deliveries per grant)",
		n, handed, news, float64(handed+news)/float64(n), lockers, float64((handed+news)*lockers)/float64(n))
	t.Logf("announcements read as a wake-up by the release before them: %d of %d; names the release that read plain announcements missed: %d of %d (third places only)", wakes, news, lostNames, names)
	if news == 0 || handed == 0 {
		t.Fatalf("%d announcements and %d hand-overs in %d grants: the waiters did not queue", news, handed, n)
	}
	if msgs := int64(handed + news); msgs > 2*n+2 {
		t.Errorf("%d messages for %d grants: more than a grant and an announcement each", msgs, n)
	}
	if wakes > 0 {
		t.Errorf("%d of %d announcements wake a waiter of the release before them, which then tries at once", wakes, news)
	}
}
