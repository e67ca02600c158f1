package electionmodel

import (
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fencekit/election"
)

// The judge on small hand-made histories: each case holds one violation
// of a kind (or none), so that a judgment that stopped looking fails here.
func TestJudge(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	floor := 10 * time.Millisecond
	// Two terms, a then b, each acting and observed; a's lock ran out.
	terms := func() []*Term {
		return []*Term{
			{Actor: 0, Value: "a", Holder: "ha", Token: 10, Begun: ms(0), DoneAt: ms(100), Lost: true,
				Acts: []Act{{ms(10), ms(11)}, {ms(90), ms(91)}}},
			{Actor: 1, Value: "b", Holder: "hb", Token: 20, Begun: ms(200), DoneAt: ms(300),
				Acts: []Act{{ms(210), ms(211)}}},
		}
	}
	observed := []election.Leader{{Value: "a", Token: 10}, {Value: "b", Token: 20}}
	events := func() []Event {
		return []Event{
			{Kind: Granted, At: ms(0), Holder: "ha", Token: 10},
			{Kind: Recorded, At: ms(1), Token: 10, Holder: "ha", LockHolder: "ha", LockToken: 10},
			{Kind: Granted, At: ms(150), Holder: "hb", Token: 20},
			{Kind: Recorded, At: ms(151), Token: 20, Holder: "hb", LockHolder: "hb", LockToken: 20, Replaced: &Record{Token: 10, Holder: "ha"}},
		}
	}
	cases := []struct {
		name   string
		change func(h *History, s *ServerLog)
		want   string // the violation's kind, "" for none
	}{
		{"sound", func(*History, *ServerLog) {}, ""},
		{"two believers", func(h *History, _ *ServerLog) { h.Terms[0].Acts = append(h.Terms[0].Acts, Act{ms(205), ms(206)}) }, "one believer"},
		{"token order", func(h *History, _ *ServerLog) { h.Terms[1].Token = 5; h.Observed = nil }, "tokens"},
		{"term not observed", func(h *History, _ *ServerLog) { h.Observed = h.Observed[:1] }, "observer"},
		{"observed out of order", func(h *History, _ *ServerLog) { h.Observed = append(h.Observed, h.Observed[0]) }, "observer"},
		{"record while free", func(_ *History, s *ServerLog) { s.Events[3].LockHolder, s.Events[3].LockToken = "", 0 }, "record holder"},
		{"record under another grant", func(_ *History, s *ServerLog) { s.Events[3].LockToken = 30 }, "record holder"},
		{"record under another holder, token unknown", func(_ *History, s *ServerLog) { s.Events[3].LockHolder, s.Events[3].LockToken = "ha", 0 }, "record holder"},
		{"record under its holder, token unknown", func(_ *History, s *ServerLog) { s.Events[3].LockToken = 0 }, ""},
		{"lower record", func(_ *History, s *ServerLog) { s.Events[3].Replaced.Token = 25 }, "record token"},
		{"planted not judged", func(_ *History, s *ServerLog) {
			s.Events = append(s.Events, Event{Kind: Recorded, At: ms(160), Token: 15, Holder: PlantedHolder, Planted: true, LockHolder: "hb", LockToken: 20})
		}, ""},
		{"twin taken as the term's own record", func(_ *History, s *ServerLog) {
			s.Events[3] = Event{Kind: Recorded, At: ms(140), Token: 20, Holder: PlantedHolder, Planted: true, Replaced: &Record{Token: 10, Holder: "ha"}}
		}, "record token"},
		{"own record, holder unknown", func(_ *History, s *ServerLog) {
			s.Events[1].Holder, s.Events[3].Holder, s.Events[3].Replaced.Holder = "", "", ""
		}, ""},
		{"late step-down", func(_ *History, s *ServerLog) { s.Events[2].At = ms(105) }, "step-down"},
		{"late step-down, server clock behind", func(_ *History, s *ServerLog) { s.Events[2].At, s.OffsetLow = ms(100), -5*time.Millisecond }, "step-down"},
		{"released: not judged", func(_ *History, s *ServerLog) {
			s.Events[2].At = ms(105)
			s.Events = append(s.Events[:2], append([]Event{{Kind: Released, At: ms(104), Holder: "ha"}}, s.Events[2:]...)...)
		}, ""},
		{"release unknown, not cut: not judged", func(_ *History, s *ServerLog) { s.Events[2].At, s.ReleasesKnown = ms(105), false }, ""},
		{"release unknown, cut ended before the grant: not judged", func(h *History, s *ServerLog) {
			s.Events[2].At, s.ReleasesKnown = ms(105), false
			h.Cuts[0] = []Interval{{ms(50), ms(102)}}
		}, ""},
		{"release unknown, cut after the term ended: not judged", func(h *History, s *ServerLog) {
			s.Events[2].At, s.ReleasesKnown = ms(105), false
			h.Cuts[0] = []Interval{{ms(101), ms(120)}}
		}, ""},
		// The lease's end: a's last act at 90 ms, its lease granted to end
		// at 110 ms and renewed to 130 ms, the floor 10 ms.
		{"lease end: sound", leaseEnd(ms(110), ms(130), 30*time.Millisecond, true), ""},
		{"lease end: last act within the floor of the renewed end", leaseEnd(ms(80), ms(95), 10*time.Millisecond, true), "step-down"},
		{"lease end: the renewal counts, not the grant", leaseEnd(ms(95), ms(120), 20*time.Millisecond, true), ""},
		{"lease end: a renewal that ends sooner does not shorten it", leaseEnd(ms(120), ms(95), 20*time.Millisecond, true), ""},
		{"lease end: server clock ahead", func(h *History, s *ServerLog) {
			leaseEnd(ms(110), ms(130), 30*time.Millisecond, true)(h, s)
			s.OffsetLow = 15 * time.Millisecond
		}, "step-down"},
		{"lease end: a term that goes by Done is not judged", leaseEnd(ms(80), ms(95), 10*time.Millisecond, false), ""},
		{"lease end: not judged without a floor", leaseEnd(ms(80), ms(95), 0, true), ""},
		{"lease end: released, not judged", func(h *History, s *ServerLog) {
			leaseEnd(ms(80), ms(95), 10*time.Millisecond, true)(h, s)
			s.Events = append(s.Events[:3], append([]Event{{Kind: Released, At: ms(96), Holder: "ha"}}, s.Events[3:]...)...)
		}, ""},
		{"release unknown, cut through", func(h *History, s *ServerLog) {
			s.Events[2].At, s.ReleasesKnown = ms(105), false
			h.Cuts[0] = []Interval{{ms(50), ms(120)}}
		}, "step-down"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := &History{Terms: terms(), Observed: append([]election.Leader(nil), observed...), Cuts: make([][]Interval, 2)}
			s := &ServerLog{Events: events(), ReleasesKnown: true}
			c.change(h, s)
			v := Judge(h, s, floor)
			if c.want == "" {
				if len(v.Violations) > 0 {
					t.Fatalf("violations %q, want none", v.Violations)
				}
				return
			}
			if len(v.Violations) == 0 || !strings.HasPrefix(v.Violations[0], c.want) {
				t.Fatalf("violations %q, want one of kind %q", v.Violations, c.want)
			}
		})
	}
}

// leaseEnd returns a change that gives a's grant the lease's end granted,
// renews it to renewed, sets the lease floor, and marks a as going by
// Leading (or by Done).
func leaseEnd(granted, renewed time.Time, floor time.Duration, byLeading bool) func(*History, *ServerLog) {
	return func(h *History, s *ServerLog) {
		h.Terms[0].ByLeading = byLeading
		s.Events[0].Expires = granted
		s.Events = append(s.Events[:2], append([]Event{{Kind: Extended, At: granted.Add(-50 * time.Millisecond), Holder: "ha", Expires: renewed}}, s.Events[2:]...)...)
		s.LeaseFloor = floor
	}
}
