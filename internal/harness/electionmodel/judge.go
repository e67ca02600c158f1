package electionmodel

import (
	"fmt"
	"slices"
	"time"

	"github.com/fencekit/fencekit/election"
	"github.com/fencekit/fencekit/fence"
)

// EventKind says what a server-side event did.
type EventKind int

const (
	// Granted: the lock was granted to Holder with Token.
	Granted EventKind = iota
	// Released: Holder gave the lock up while its lease still ran (a
	// release, or a release that handed the lock over): the next grant is
	// not judged for its step-down gap.
	Released
	// Recorded: the record was written with Token (and Holder, where the
	// backend keeps it) while LockHolder held the lock with LockToken
	// ("" and 0: the lock was free; either alone where the backend knows
	// only one), over Replaced (nil: no live record).
	Recorded
	// Extended: Holder's lease was renewed to end at Expires.
	Extended
)

// Record is a record as the server held it.
type Record struct {
	Token  fence.Token
	Holder string // "" where the backend keeps no holder beside the record
}

// Event is one write of the server's own history, in the server's order.
type Event struct {
	Kind EventKind
	// At is the event's time on the server's clock, or an upper bound of
	// it on the local clock (see ServerLog.Offset).
	At         time.Time
	Holder     string
	Token      fence.Token
	Value      string
	LockHolder string
	LockToken  fence.Token
	Replaced   *Record
	// Planted marks a record the planter wrote (not judged).
	Planted bool
	// Expires is the end of the lease a Granted or Extended event gave
	// Holder, on the server's clock; zero where the backend's log does not
	// record it.
	Expires time.Time
}

// ServerLog is a backend's own history of the lock's and the record's
// writes during a run.
type ServerLog struct {
	Events []Event
	// OffsetLow is the least the server's clock can be ahead of the local
	// one (server minus local, measured around a query of the server's
	// clock); 0 where At is already on the local clock.
	OffsetLow time.Duration
	// ReleasesKnown says that every release shows as a Released event
	// (the server tells a release from a lease that ran out). Where it
	// cannot, a term is judged for its step-down gap only when its
	// candidate was cut off from before the term ended until after the
	// next grant: no release could have reached the server.
	ReleasesKnown bool
	// LeaseFloor, where the log records each lease's end (Event.Expires),
	// is the least time the judge accepts between a lost term's last act
	// admitted by [election.Term.Leading] and the end of its lease on the
	// server (see judgeLeaseEnd); 0: not judged.
	LeaseFloor time.Duration
}

// Verdict is what the judge judged and found.
type Verdict struct {
	Counts     map[string]int
	Violations []string
	Gaps       []time.Duration // lost terms' ends to the next grants
	LeaseGaps  []time.Duration // lost terms' last acts to their leases' ends
}

func (v *Verdict) count(k string, n int) { v.Counts[k] += n }

func (v *Verdict) violate(format string, args ...any) {
	v.Violations = append(v.Violations, fmt.Sprintf(format, args...))
}

// Judge judges a run: the client's history h against the server's log s,
// with floor the least step-down gap.
func Judge(h *History, s *ServerLog, floor time.Duration) *Verdict {
	v := &Verdict{Counts: map[string]int{}}
	for k, n := range h.Counts {
		v.count(k, n)
	}
	terms := slices.Clone(h.Terms)
	slices.SortFunc(terms, func(a, b *Term) int { return a.Begun.Compare(b.Begun) })
	for _, r := range terms {
		v.count("terms", 1)
		v.count("acts", len(r.Acts))
		if r.Lost {
			v.count("terms lost", 1)
		} else {
			v.count("terms resigned", 1)
		}
	}
	judgeBelievers(v, terms)
	judgeTokens(v, terms)
	judgeObserver(v, terms, h.Observed, h.ObserveEvery)
	if s != nil {
		judgeRecords(v, s)
		judgeOwnRecords(v, terms, []*ServerLog{s})
		judgeStepDown(v, h, s, floor)
		judgeLeaseEnd(v, h, s)
	}
	return v
}

// JudgeNodes judges a run on a lock of several independent servers
// (Redlock): the client's history once, as Judge does, and each server's
// own history of writes alone against it (every record a node wrote names
// the grant that node held, never replaces a newer record there, and a
// term whose lock ran out on the node ended a floor before the node
// granted the lock to another term). A server-side violation names its
// node after its kind.
func JudgeNodes(h *History, logs []*ServerLog, floor time.Duration) *Verdict {
	v := Judge(h, nil, floor)
	judgeOwnRecords(v, h.Terms, logs)
	for i, s := range logs {
		n := &Verdict{Counts: map[string]int{}}
		judgeRecords(n, s)
		judgeStepDown(n, h, s, floor)
		for k, c := range n.Counts {
			v.count(k, c)
		}
		for _, x := range n.Violations {
			v.violate("%s (node %d)", x, i)
		}
		v.Gaps = append(v.Gaps, n.Gaps...)
	}
	return v
}

// judgeBelievers: every act of every term against the start of every term
// that began after that term did.
func judgeBelievers(v *Verdict, terms []*Term) {
	for i, a := range terms {
		for _, b := range terms[i+1:] {
			if b.Token == a.Token {
				v.violate("one believer: two terms with token %d", a.Token)
				continue
			}
			for _, x := range a.Acts {
				if x.At.After(b.Begun) {
					v.violate("one believer: term %d (%s) acted %v after term %d (%s) began", a.Token, a.Value, x.At.Sub(b.Begun), b.Token, b.Value)
					break
				}
			}
			if len(a.Acts) > 0 {
				v.count("pairs judged (one believer)", 1)
			}
		}
	}
}

// judgeTokens: the term whose acts came first has the lower token.
func judgeTokens(v *Verdict, terms []*Term) {
	for i, a := range terms {
		for _, b := range terms[i+1:] {
			if len(a.Acts) == 0 || len(b.Acts) == 0 {
				continue
			}
			if a.Acts[len(a.Acts)-1].Checked.Before(b.Acts[0].At) {
				v.count("pairs judged (tokens)", 1)
				if a.Token >= b.Token {
					v.violate("tokens: term %d (%s) acted before term %d (%s)", a.Token, a.Value, b.Token, b.Value)
				}
			}
		}
	}
}

// judgeObserver: every term that acted was reported, with its value, and
// the reported tokens strictly increase.
func judgeObserver(v *Verdict, terms []*Term, observed []election.Leader, every time.Duration) {
	seen := map[fence.Token]string{}
	for i, l := range observed {
		if i > 0 && l.Token <= observed[i-1].Token {
			v.violate("observer: token %d reported after %d", l.Token, observed[i-1].Token)
		}
		seen[l.Token] = l.Value
	}
	for _, r := range terms {
		if len(r.Acts) == 0 {
			continue
		}
		val, ok := seen[r.Token]
		if !ok && every > 0 {
			end := r.DoneAt
			if end.IsZero() {
				end = r.Acts[len(r.Acts)-1].Checked
			}
			if end.Sub(r.Begun) < 2*every {
				v.count("terms shorter than two observer reads, not reported (excused)", 1)
				continue
			}
		}
		v.count("terms judged (observer)", 1)
		if !ok || val != r.Value {
			v.violate("observer: term %d (%s) not reported (reported %q)", r.Token, r.Value, val)
		}
	}
}

// judgeRecords judges every record written (but the planted ones): it
// names the grant that holds the lock, and it never replaces a live record
// of a newer grant.
func judgeRecords(v *Verdict, s *ServerLog) {
	for _, e := range s.Events {
		if e.Kind != Recorded || e.Planted {
			continue
		}
		v.count("record writes judged (holder)", 1)
		switch {
		case e.LockToken == 0 && e.LockHolder == "":
			v.violate("record holder: the record of term %d (%s) was written while the lock was free: a phantom leader", e.Token, e.Value)
		case (e.LockToken != 0 && e.LockToken != e.Token) || (e.Holder != "" && e.LockHolder != "" && e.LockHolder != e.Holder):
			other := fmt.Sprintf("term %d", e.LockToken)
			if e.LockToken == 0 {
				other = fmt.Sprintf("holder %s", e.LockHolder)
			}
			v.violate("record holder: the record of term %d (%s) was written while the lock was held by %s: a phantom leader", e.Token, e.Value, other)
		}
		if e.Replaced == nil {
			continue
		}
		v.count("record writes judged (token)", 1)
		was := e.Replaced
		if was.Token > e.Token || (was.Token == e.Token && was.Holder != "" && e.Holder != "" && was.Holder != e.Holder) {
			v.violate("record token: the record of term %d (%s) replaced a live record of term %d", e.Token, e.Value, was.Token)
		}
	}
}

// judgeOwnRecords: every term that acted had a record of its own written
// (its token, and its holder where the log keeps one) on the server, or
// on one of the servers of logs. A term whose record write met a record
// of its token and another holder (a twin) and took that record as its
// own would act while the record, and every observer, names the other.
// Judged only where the logs hold the records the backend's scripts
// wrote.
func judgeOwnRecords(v *Verdict, terms []*Term, logs []*ServerLog) {
	type rec struct {
		token  fence.Token
		holder string
	}
	written := map[rec]bool{}
	any := false
	for _, s := range logs {
		for _, e := range s.Events {
			if e.Kind == Recorded && !e.Planted {
				written[rec{e.Token, e.Holder}] = true
				any = true
			}
		}
	}
	// Where the log names each grant's token, how many planted records
	// (twins) the grant of their own token met.
	planted := map[fence.Token]bool{}
	for _, s := range logs {
		for _, e := range s.Events {
			if e.Kind == Recorded && e.Planted {
				planted[e.Token] = true
			}
		}
	}
	for _, s := range logs {
		for _, e := range s.Events {
			if e.Kind == Granted && e.Token != 0 && planted[e.Token] {
				v.count("twins met by their token's grant", 1)
				delete(planted, e.Token)
			}
		}
	}
	if !any {
		return
	}
	for _, t := range terms {
		if len(t.Acts) == 0 {
			continue
		}
		v.count("terms judged (own record)", 1)
		if !written[rec{t.Token, t.Holder}] && !written[rec{t.Token, ""}] {
			v.violate("record token: term %d (%s) acted, but no record of its own was written: the record it took for its own names another holder", t.Token, t.Value)
		}
	}
}

// judgeStepDown judges each term against the lock's next grant, when the
// term's lock ran out rather than being released (a term lost, or resigned
// while its release could not reach the server).
func judgeStepDown(v *Verdict, h *History, s *ServerLog, floor time.Duration) {
	grant := map[string]int{} // holder → index of its grant
	for i, e := range s.Events {
		if e.Kind == Granted {
			grant[e.Holder] = i
		}
	}
	for _, r := range h.Terms {
		gi, ok := grant[r.Holder]
		if !ok || r.DoneAt.IsZero() {
			continue
		}
		for _, e := range s.Events[gi+1:] {
			if e.Kind == Released && e.Holder == r.Holder {
				if r.Lost {
					v.count("losses released (not judged for the gap)", 1)
				}
				break
			}
			if e.Kind != Granted || e.Holder == r.Holder {
				continue
			}
			// The grant's time on the local clock is at most At less the
			// least offset: the gap below is the largest it can be.
			gap := e.At.Add(-s.OffsetLow).Sub(r.DoneAt)
			if !s.ReleasesKnown && !cutThrough(h.Cuts[r.Actor], r.DoneAt, e.At.Add(-s.OffsetLow)) {
				v.count("terms ended, release unknown (not judged for the gap)", 1)
				break
			}
			v.count("terms run out (step-down gap judged)", 1)
			v.Gaps = append(v.Gaps, gap)
			if gap < floor {
				v.violate("step-down: term %d (%s) ended %v before the lock's next grant, below the floor %v", r.Token, r.Value, gap, floor)
			}
			break
		}
	}
}

// cutThrough reports whether one of cuts covers from before from until
// after to.
func cutThrough(cuts []Interval, from, to time.Time) bool {
	for _, c := range cuts {
		if c.From.Before(from) && c.To.After(to) {
			return true
		}
	}
	return false
}

// judgeLeaseEnd judges each term whose lock ran out against the end of its
// lease as the server recorded it (the last Expires of its grant and
// renewals before the lock went to another holder), where the log records
// it: the term's last act that [election.Term.Leading] admitted came at
// least s.LeaseFloor before that end. Unlike the next grant, which a busy
// machine delays by however long the next candidate takes, the lease's end
// is fixed by the server when it granted or renewed, so an elector whose
// step-down margin is too small is seen whatever the load. The act's At is
// taken before its check, so the term believed at some instant at or after
// it; Leading admits an act only while the lease's validity (counted from
// before the grant or renewal was sent) is above the margin, so an honest
// term's gap is at least its margin plus the drift allowance, however late
// the act ran. Terms that go by Done are not judged here: a timer that
// fires late on a busy machine closes Done late, and judgeStepDown judges
// them.
func judgeLeaseEnd(v *Verdict, h *History, s *ServerLog) {
	if s.LeaseFloor <= 0 {
		return
	}
	for _, r := range h.Terms {
		if !r.ByLeading || len(r.Acts) == 0 {
			continue
		}
		var end time.Time
		granted, ranOut := false, false
		for _, e := range s.Events {
			if !granted {
				if e.Kind == Granted && e.Holder == r.Holder {
					granted = true
					end = e.Expires
				}
				continue
			}
			if e.Kind == Released && e.Holder == r.Holder {
				break
			}
			if e.Kind == Extended && e.Holder == r.Holder && e.Expires.After(end) {
				end = e.Expires
			}
			if e.Kind == Granted && e.Holder != r.Holder {
				ranOut = true
				break
			}
		}
		if !ranOut || end.IsZero() {
			continue
		}
		v.count("terms run out (lease end judged)", 1)
		last := r.Acts[len(r.Acts)-1].At
		// The lease's end on the local clock is at most Expires less
		// the least offset: the gap below is the largest it can be.
		gap := end.Add(-s.OffsetLow).Sub(last)
		v.LeaseGaps = append(v.LeaseGaps, gap)
		if gap < s.LeaseFloor {
			v.violate("step-down: term %d (%s) acted %v before its lease's end on the server, below the floor %v", r.Token, r.Value, gap, s.LeaseFloor)
		}
	}
}
