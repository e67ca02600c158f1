package lock_test

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fencekit/fencekit/lock"
	"github.com/redis/go-redis/v9"
)

// The model's renewal check. DESIGN 4c: renewal is scheduled from what is
// left of a lease, not from its nominal ttl: a renewal is sent while two
// thirds of the lease are left. The check reads, from each actor's client,
// how much validity a self-renewing lease had left when each of its
// extensions was sent (other than its actor's own Extend calls), and
// judges each such lease that its actor held past its first validity:
// some renewal of it must have been sent in time, with a sixth of the
// lease or more left. A loaded machine delays some renewals, so the check
// fails a run only when most leases had none: a renewal scheduled at the
// lease's end is sent with nothing left, or not at all (its call's
// deadline, the lease's end, has passed).

// renewMinTTL is the shortest lease whose renewal is judged: its renewal
// is in time unless a loaded machine delays it by 30ms or more.
const renewMinTTL = 60 * time.Millisecond

// renewLate is the share of its ttl below which a renewal counts as late.
const renewLate = 1.0 / 6

// renewHook records the validity left when each renewal is sent.
type renewHook struct{ m *model }

func (h renewHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h renewHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h renewHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if call, ok := parseScriptCall(cmd.Args()); ok && call.name == "extend" && len(call.argv) >= 2 {
			h.m.renewMu.Lock()
			held := h.m.renewing[call.argv[0]]
			if _, ok := h.m.firstRenewal[call.argv[0]]; !ok && (held == nil || !held.extending.Load()) {
				h.m.firstRenewal[call.argv[0]] = time.Now()
			}
			if held == nil {
				// A renewal sent before its actor registered the lease, as
				// early as any can be (an actor's own Extend needs the
				// lease registered first).
				h.m.earlyRenewal[call.argv[0]] = true
			}
			h.m.renewMu.Unlock()
			ms, err := strconv.ParseInt(call.argv[1], 10, 64)
			if held != nil && !held.extending.Load() && err == nil && ms > 0 {
				left := held.l.Validity()
				share := float64(left) / float64(time.Duration(ms)*time.Millisecond)
				if share >= renewLate {
					held.timely.Store(true)
				}
				h.m.count("renewals sent", 1)
				h.m.renewMu.Lock()
				h.m.renewals = append(h.m.renewals, share)
				h.m.renewMu.Unlock()
			}
		}
		return next(ctx, cmd)
	}
}

// checkRenewals fails the run when most judged leases had no renewal
// sent in time, and reports how much was left when renewals were sent.
func (m *model) checkRenewals() {
	m.renewMu.Lock()
	shares := slices.Clone(m.renewals)
	m.renewMu.Unlock()
	if len(shares) == 0 {
		return
	}
	slices.Sort(shares)
	late := 0
	for _, s := range shares {
		if s < renewLate {
			late++
		}
	}
	m.count("renewals sent late (under a sixth of the lease left)", int64(late))
	m.count("renewals sent: median share of the lease left, in %", int64(100*shares[len(shares)/2]))
	judged, missed := m.stat("renewals judged"), m.stat("renewals judged: none sent in time")
	if judged > 0 && 2*missed > judged {
		m.violation("renewal", "share", "%d of %d self-renewing leases held past their first validity had no renewal sent with a sixth of the lease left (renewals sent: median %.0f%% left): renewal is not scheduled from what is left",
			missed, judged, 100*shares[len(shares)/2])
	}
}

// judgeRenewal judges, as its actor gives it up, a self-renewing lease
// without Owner that its first validity would not have covered until now:
// was a renewal sent in time? It also counts leases that lapsed, for the
// report only (a loaded machine lets some lapse whose renewal was sent in
// time: its reply came late).
func (m *model) judgeRenewal(h *held) {
	// Only a lease that started with half its ttl or more left is judged
	// (a waiter dates a lease handed to it from its entry's last refresh,
	// so it may start with little or nothing left), once it is held past
	// the validity it started with.
	if h.short != nil && !h.owner && !m.redlock && !strings.Contains(h.g.opts, "+closed") {
		m.judgeShortStart(h)
		return
	}
	if !h.renew || h.owner || m.redlock || h.g.ttl < renewMinTTL || h.startLeft < h.g.ttl/2 || time.Now().Before(h.g.end.Add(h.startLeft)) {
		return
	}
	if strings.Contains(h.g.opts, "+closed") {
		return // its Locker was closed, which stops renewal
	}
	if h.ext.Load() != 0 || h.extFailed.Load() != 0 {
		return // its actor's Extend moved its expiry: renewal had no set moment
	}
	m.count("renewals judged", 1)
	m.renewMu.Lock()
	early := m.earlyRenewal[h.g.f.Holder]
	m.renewMu.Unlock()
	if !h.timely.Load() && !early {
		m.count("renewals judged: none sent in time", 1)
		if m.cfg.renewAtEnd {
			m.exposed.Add(1) // the broken renewal went wrong
		}
	}
	if h.l.Err() != nil {
		m.count("renewals judged: lapsed", 1)
	}
}

// The short-start renewal check. A lease that starts with less than two
// thirds of its ttl left (a grant whose reply came late, or that a waiter
// found late) is renewed at once: its renewal is scheduled from what is
// left, and what is left is already below the two thirds at which a lease
// renews. A renewal scheduled from the nominal ttl waits a third of the
// ttl instead, with the lease then short of that third, or gone. The
// workload makes such leases by holding back the reply to a try's grant
// (slowReplyHook) for two fifths to three quarters of its ttl; the check
// judges each that its actor held for a third of its ttl after the reply:
// its first renewal must have been sent within a sixth of its ttl of the
// reply, that is, with no more than a sixth of the ttl gone from what it
// started with. A loaded machine delays some renewals past that, so the
// check fails a run only when most leases had none in time.

// shortLate is the share of its ttl after its grant's reply by which a
// short-starting lease's first renewal must have been sent.
const shortLate = 1.0 / 6

// slowGrant holds back the reply to the try it rides on (in its context):
// the lease starts with delay gone. The hook fills in when the try was
// sent and when its reply was handed back.
type slowGrant struct {
	delay         time.Duration
	sent, replied time.Time
}

type slowGrantKey struct{}

// slowReplyHook holds back the reply to an acquire or a try that grants
// the lock (afresh or by a hand-over) by its context's slowGrant.
type slowReplyHook struct{}

func (slowReplyHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (slowReplyHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (slowReplyHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		sg, _ := ctx.Value(slowGrantKey{}).(*slowGrant)
		if sg == nil {
			return next(ctx, cmd)
		}
		if call, ok := parseScriptCall(cmd.Args()); !ok || call.name != "try" && call.name != "acquire" {
			return next(ctx, cmd)
		}
		sent := time.Now()
		err := next(ctx, cmd)
		if c, ok := cmd.(*redis.Cmd); ok && err == nil {
			r, ok := parseAcquireReply(c.Val())
			_, fast := c.Val().(string) // the try's fast path grants with the token as text
			if fast || ok && (r.shape == shapeGranted || r.shape == shapeHandedOver) {
				time.Sleep(sg.delay)
				sg.sent, sg.replied = sent, time.Now()
			}
		}
		return err
	}
}

// takeShort acquires a self-renewing lease whose grant's reply is held
// back, so that it starts with less than two thirds of its ttl left, and
// holds it for half its ttl before anything else.
func (a *actor) takeShort(ctx context.Context) *held {
	var opts []lock.AcquireOption
	if !a.m.cfg.renewAtEnd && !a.m.cfg.renewNominal {
		opts = append(opts, lock.AutoRenew())
	}
	ttl := time.Duration([]int{90, 150, 250}[a.rng.IntN(3)]) * time.Millisecond
	sg := &slowGrant{delay: ttl * time.Duration(40+a.rng.IntN(36)) / 100}
	start, epochs := time.Now(), a.m.epochs()
	gctx, cancel := context.WithTimeout(context.WithValue(ctx, slowGrantKey{}, sg), time.Duration(100+a.rng.IntN(900))*time.Millisecond)
	l, err := a.l.Acquire(gctx, a.m.resource, ttl, opts...)
	cancel()
	if err != nil {
		a.m.count("short-start acquires given up", 1)
		return nil
	}
	h := a.register(l, a.kind, ttl, start, epochs, "+renew+short")
	if sg.replied.IsZero() {
		a.m.count("short-start grants not held back", 1)
		return h // a reply of no known shape: not held back
	}
	a.m.count("short-start leases", 1)
	h.short = sg
	a.sleep(ttl / 2)
	return h
}

// judgeShortStart judges a short-starting lease as its actor gives it up,
// once held for a third of its ttl after its grant's reply: was its first
// renewal sent within a sixth of its ttl of that reply?
func (m *model) judgeShortStart(h *held) {
	sg, ttl := h.short, h.g.ttl
	if time.Since(sg.replied) < ttl/3 {
		return
	}
	m.count("short-start renewals judged", 1)
	m.renewMu.Lock()
	first, ok := m.firstRenewal[h.g.f.Holder]
	m.renewMu.Unlock()
	if ok {
		after := first.Sub(sg.replied)
		m.renewMu.Lock()
		m.shortDelays = append(m.shortDelays, float64(after)/float64(ttl))
		m.renewMu.Unlock()
		if float64(after) <= shortLate*float64(ttl) {
			return
		}
	}
	m.count("short-start renewals judged: none sent in time", 1)
	if m.cfg.renewNominal {
		m.exposed.Add(1) // the broken renewal went wrong
	}
}

// checkShortStarts fails the run when most judged short-starting leases
// had no renewal sent in time.
func (m *model) checkShortStarts() {
	m.renewMu.Lock()
	delays := slices.Clone(m.shortDelays)
	m.renewMu.Unlock()
	median := -1.0
	if len(delays) > 0 {
		slices.Sort(delays)
		median = delays[len(delays)/2]
		m.count("short-start renewals: median delay after the reply, in % of the ttl", int64(100*median))
	}
	judged, missed := m.stat("short-start renewals judged"), m.stat("short-start renewals judged: none sent in time")
	if judged > 0 && 2*missed > judged {
		m.violation("renewal-short", "share", "%d of %d leases that started with under two thirds of their ttl left had no renewal sent within a sixth of the ttl (median delay %.0f%% of the ttl, -100 for none): renewal is not scheduled from what is left",
			missed, judged, 100*median)
	}
}

// renewNominal is the short-start control's broken renewal: it extends
// the lease every third of its nominal ttl, whatever is left of it.
func renewNominal(l *lock.Lease, ttl time.Duration, stop <-chan struct{}) {
	for {
		t := time.NewTimer(ttl / 3)
		select {
		case <-stop:
			t.Stop()
			return
		case <-t.C:
		}
		if l.Validity() <= 0 {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = l.Extend(ctx, ttl)
		cancel()
	}
}
