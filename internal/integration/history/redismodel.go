package history

import (
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

// Redis store operations, as the model knows them. Update and Modify are
// recorded as their two steps (a read, then a version-checked write), each
// a call of its own, since that is what they are: the function they are
// given runs between the steps and marks the boundary.
const (
	OpLoad = "load" // Load: unfenced read
	OpCAS  = "cas"  // CompareAndSet, and Modify's write
	OpCAD  = "cad"  // CompareAndDelete
	OpGet  = "get"  // Get, and Update's read: fenced read
	OpSet  = "set"  // Set: fenced write
	OpSetV = "setv" // SetIfVersion, and Update's write
	OpDel  = "del"  // Delete: fenced delete
)

// Outcomes of a call. Unknown is a call that stays open: it may have been
// applied or not.
const (
	Ok       = "ok"
	NotFound = "notfound"
	Stale    = "stale"
	Conflict = "conflict"
	Unknown  = "unknown"
	// Failed is a call whose error says it was not applied: an error
	// that does not match fence.ErrOutcomeUnknown.
	Failed = "failed"
)

// Mark is a high-water mark or a fence: a token and its holder. The zero
// Mark admits every fence.
type Mark struct {
	Token  int64
	Holder string
}

// admits is the fence rule: a newer token, or the mark's own token and
// holder.
func (m Mark) admits(f Mark) bool {
	return f.Token > m.Token || (f.Token == m.Token && f.Holder == m.Holder)
}

func (m Mark) String() string {
	if m.Token == 0 {
		return "-"
	}
	h := m.Holder
	if len(h) > 6 {
		h = h[:6]
	}
	return fmt.Sprintf("%d/%s", m.Token%100000000, h)
}

// RedisIn is one call on one key of the Redis store.
type RedisIn struct {
	Key      string
	Op       string
	Fence    Mark   // fenced calls
	Expected int64  // cas, cad, setv
	Data     string // cas, set, setv
	// TTL is the lifetime a write gives its value (cas, set; 0: none). A
	// write without one makes the value permanent, as the store does.
	TTL time.Duration
	// Attack names what an adversarial call offers that no honest client
	// would (see the Attack constants), "" for an honest call. The model
	// judges it like any other; the name is for counting and reading.
	Attack string
	// From and To are the call's invocation and return, in the history's
	// time (To is math.MaxInt64 for an open call): copied from the
	// operation by StampRedis, since the model's steps see no times, and
	// needed to tell when a value's lifetime ended.
	From, To int64
}

// StampRedis copies each operation's times into its input (see RedisIn.From),
// as the model needs them to judge values that expire. Run it on a finished
// history, before checking it.
func StampRedis(ops []porcupine.Operation) []porcupine.Operation {
	for i := range ops {
		in := ops[i].Input.(RedisIn)
		in.From, in.To = ops[i].Call, ops[i].Return
		ops[i].Input = in
	}
	return ops
}

// Adversarial calls: fences that no lock issued, and versions a key never
// had or no longer has.
const (
	AttackOtherHolder = "same token, other holder" // the token of a live grant, with a holder that never had it
	AttackOlderToken  = "older token, real holder" // a live grant's holder, with a token older than its own
	AttackStolen      = "other grant's holder"     // a live grant's token, with the holder of another grant of the resource
	AttackRacing      = "older grant racing"       // a live grant's fence, used while the next grant makes its first call
	AttackAbove       = "version above"            // a compare-and-set at a version the key has not reached
	AttackBelow       = "version below"            // a compare-and-set at a version the key has passed
	AttackExpired     = "version before expiry"    // a compare-and-set at the version of a value that has since expired
)

// RedisOut is what a call returned.
type RedisOut struct {
	Status  string
	Data    string // ok of load and get
	Version int64  // ok and notfound of load and get; ok of cas, cad, set, setv; conflict: the version found, or -1 when not reported
	Mark    Mark   // stale: the mark the fence lost to
}

// RedisState is one key: its value, its version and its mark, and, for a
// value written with a lifetime, when it expires: somewhere in [ExpFrom,
// ExpTo] of the history's time (both 0: never). An expiry counts as a delete:
// the value goes and the version moves on, the mark stays.
type RedisState struct {
	Exists         bool
	Data           string
	Version        int64
	Mark           Mark
	ExpFrom, ExpTo int64
}

// expiryMargin widens a value's expiry window on both sides: the store dates
// an expiry by the server's clock in whole milliseconds, the history by the
// test's monotonic clock, on the same machine.
const expiryMargin = 5 * time.Millisecond

// expired is s once its value's lifetime ended: deleted, at the next
// version.
func (s RedisState) expired() RedisState {
	s.Exists, s.Data, s.Version = false, "", s.Version+1
	s.ExpFrom, s.ExpTo = 0, 0
	return s
}

// before lists the states that in may meet, given s before it: s as it is,
// unless its value surely expired before in was invoked; and s expired, if
// the expiry may have come before in returned.
func (s RedisState) before(in RedisIn) []RedisState {
	if s.ExpTo == 0 {
		return []RedisState{s}
	}
	var states []RedisState
	if in.From < s.ExpTo {
		states = append(states, s)
	}
	if in.To > s.ExpFrom {
		states = append(states, s.expired())
	}
	return states
}

// lifetime gives n, just written by in, the expiry in's TTL sets: a window
// from in's invocation plus the TTL to its return plus the TTL (for ever
// open, for an open call), or none.
func (n RedisState) lifetime(in RedisIn) RedisState {
	n.ExpFrom, n.ExpTo = 0, 0
	if in.TTL > 0 {
		n.ExpFrom = max(1, in.From+int64(in.TTL-expiryMargin))
		n.ExpTo = math.MaxInt64
		if in.To < math.MaxInt64-int64(in.TTL+expiryMargin) {
			n.ExpTo = in.To + int64(in.TTL+expiryMargin)
		}
	}
	return n
}

// redisApply returns the state after in was applied to s and the output it
// gives. Every check comes before any change, so a refusal returns s.
func redisApply(s RedisState, in RedisIn) (RedisState, RedisOut) {
	switch in.Op {
	case OpLoad:
		if !s.Exists {
			return s, RedisOut{Status: NotFound, Version: s.Version}
		}
		return s, RedisOut{Status: Ok, Data: s.Data, Version: s.Version}
	case OpCAS, OpCAD:
		if s.Version != in.Expected {
			return s, RedisOut{Status: Conflict, Version: s.Version}
		}
		n := s
		if in.Op == OpCAS {
			n.Exists, n.Data, n.Version = true, in.Data, s.Version+1
			n = n.lifetime(in)
		} else if s.Exists {
			n.Exists, n.Data, n.Version = false, "", s.Version+1
			n.ExpFrom, n.ExpTo = 0, 0
		}
		return n, RedisOut{Status: Ok, Version: n.Version}
	}
	// Fenced: the fence first, then the version, then the change.
	if !s.Mark.admits(in.Fence) {
		return s, RedisOut{Status: Stale, Mark: s.Mark}
	}
	if in.Op == OpSetV && s.Version != in.Expected {
		return s, RedisOut{Status: Conflict, Version: s.Version}
	}
	n := s
	n.Mark = in.Fence
	switch in.Op {
	case OpGet:
		if !s.Exists {
			return n, RedisOut{Status: NotFound, Version: s.Version}
		}
		return n, RedisOut{Status: Ok, Data: s.Data, Version: s.Version}
	case OpSet, OpSetV:
		n.Exists, n.Data, n.Version = true, in.Data, s.Version+1
		return n.lifetime(in), RedisOut{Status: Ok, Version: n.Version}
	case OpDel:
		if s.Exists {
			n.Exists, n.Data, n.Version = false, "", s.Version+1
			n.ExpFrom, n.ExpTo = 0, 0
		}
		return n, RedisOut{Status: Ok}
	}
	panic("history: unknown Redis operation " + in.Op)
}

// RedisModel is the Redis store, per key: a versioned, fenced register.
// A call that returned is explained only by the state that gives its exact
// output; an open call may have been applied, or not.
var RedisModel = porcupine.NondeterministicModel{
	Partition: partitionBy(func(in any) string { return in.(RedisIn).Key }),
	Init:      func() []any { return []any{RedisState{}} },
	Step: func(state, input, output any) []any {
		in, out := input.(RedisIn), output.(RedisOut)
		var next []any
		add := func(n RedisState) {
			for _, m := range next {
				if m == n {
					return
				}
			}
			next = append(next, n)
		}
		// The value may have expired before the call took effect, or
		// not, as the expiry's window and the call's allow.
		for _, s := range state.(RedisState).before(in) {
			n, want := redisApply(s, in)
			switch {
			case out.Status == Failed:
				add(s) // not applied: changes nothing, whatever it asked
			case out.Status == Unknown:
				add(s)
				add(n)
			default:
				if out.Status == Conflict && out.Version < 0 && want.Status == Conflict {
					want.Version = out.Version // a conflict whose version was not reported
				}
				if out == want {
					add(n)
				}
			}
		}
		return next
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(RedisIn), output.(RedisOut)
		var call string
		switch in.Op {
		case OpLoad:
			call = "load()"
		case OpCAS:
			call = fmt.Sprintf("cas(v%d, %s)", in.Expected, in.Data)
		case OpCAD:
			call = fmt.Sprintf("cad(v%d)", in.Expected)
		case OpGet, OpDel:
			call = fmt.Sprintf("%s[%v]()", in.Op, in.Fence)
		case OpSet:
			call = fmt.Sprintf("set[%v](%s)", in.Fence, in.Data)
		case OpSetV:
			call = fmt.Sprintf("setv[%v](v%d, %s)", in.Fence, in.Expected, in.Data)
		}
		if in.TTL > 0 {
			call += fmt.Sprintf(" ttl %v", in.TTL)
		}
		if in.Attack != "" {
			call += " {" + in.Attack + "}"
		}
		return call + " -> " + describeOut(out.Status, out.Data, out.Version, out.Mark)
	},
	DescribeState: func(state any) string {
		s := state.(RedisState)
		if !s.Exists {
			return fmt.Sprintf("none v%d mark %v", s.Version, s.Mark)
		}
		d := fmt.Sprintf("%s v%d mark %v", s.Data, s.Version, s.Mark)
		if s.ExpTo != 0 {
			to := "+inf"
			if s.ExpTo != math.MaxInt64 {
				to = fmt.Sprintf("%.3f", float64(s.ExpTo)/1e6)
			}
			d += fmt.Sprintf(" expires in [%.3f, %s] ms", float64(s.ExpFrom)/1e6, to)
		}
		return d
	},
}

func describeOut(status, data string, version int64, mark Mark) string {
	switch status {
	case Ok:
		if data != "" {
			return fmt.Sprintf("ok %s v%d", data, version)
		}
		return fmt.Sprintf("ok v%d", version)
	case NotFound, Conflict:
		return fmt.Sprintf("%s v%d", status, version)
	case Stale:
		return fmt.Sprintf("stale, mark %v", mark)
	}
	return status
}

// partitionBy splits a history by key, in a fixed order: a history is
// linearizable when each key's is, since no call touches two keys.
func partitionBy(key func(in any) string) func([]porcupine.Operation) [][]porcupine.Operation {
	return func(ops []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		for _, op := range ops {
			k := key(op.Input)
			byKey[k] = append(byKey[k], op)
		}
		keys := make([]string, 0, len(byKey))
		for k := range byKey {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	}
}
