package lock_test

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"time"

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
