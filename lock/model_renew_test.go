package lock_test

import (
	"context"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// The model's renewal check. DESIGN 4c: renewal is scheduled from what is
// left of a lease, not from its nominal ttl: a renewal is sent while two
// thirds of the lease are left. The check reads, from each actor's client,
// how much validity a self-renewing lease had left when each of its
// extensions was sent (other than its actor's own Extend calls). A loaded
// machine delays some renewals, so the check judges their median rather
// than each one: a renewal scheduled at the lease's end, or from a
// nominal ttl longer than what was left, is sent with nothing left.

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
			h.m.renewMu.Unlock()
			ms, err := strconv.ParseInt(call.argv[1], 10, 64)
			if held != nil && !held.extending.Load() && err == nil && ms > 0 {
				left := held.l.Validity()
				share := float64(left) / float64(time.Duration(ms)*time.Millisecond)
				if h.m.cfg.renewAtEnd && share < renewLate {
					h.m.exposed.Add(1) // the broken renewal went wrong
				}
				h.m.count("renewals judged", 1)
				h.m.renewMu.Lock()
				h.m.renewals = append(h.m.renewals, share)
				h.m.renewMu.Unlock()
			}
		}
		return next(ctx, cmd)
	}
}

// checkRenewals judges the renewals sent: fewer than half may be late.
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
	m.count("renewals: median share of the lease left when sent, in %", int64(100*shares[len(shares)/2]))
	if 2*late > len(shares) {
		m.violation("renewal", "median", "%d of %d renewals were sent with under a sixth of their lease left (median %.0f%%): renewal is not scheduled from what is left",
			late, len(shares), 100*shares[len(shares)/2])
	}
}

// judgeLapse counts, as its actor gives it up, a self-renewing lease that
// its first validity would not have covered until now, and whether it had
// lapsed: figures for the report, not judged (a loaded machine lets some
// lapse).
func (m *model) judgeLapse(h *held) {
	if !h.renew || m.redlock || time.Now().Before(h.g.start.Add(h.g.ttl)) {
		return
	}
	m.count("renewed leases held past their first validity", 1)
	if h.l.Err() != nil {
		m.count("renewed leases held past their first validity: lapsed", 1)
	}
}
