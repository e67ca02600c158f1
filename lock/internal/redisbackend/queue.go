package redisbackend

import (
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/fencekit/fencekit/internal/lockbackend"
)

// The wait queue's client side: how long entries live, and the grant
// message a release publishes for the waiter it handed the lock to. The
// protocol itself is in acquire.lua, release.lua and handover.lua.

const (
	// queueRefresh is how often a queued waiter refreshes its entry; an
	// entry not refreshed for queueLife is passed over. queueLife bounds how
	// long a waiter that vanished (a crashed process) can still be granted
	// the lock, which then stays taken until its lease runs out.
	queueRefresh = lockbackend.QueueRefresh
	queueLife    = lockbackend.QueueLife
)

// The first waiters of the queue try when the current lease ends, each
// a little after the one ahead of it: the head at the end, the next ones
// nextInLine and twice that later, so that a waiter that vanished at the
// head (it neither tries nor refreshes, but its entry is still live) holds
// up the others for no more than the lease it is handed and nextInLine,
// and a live head is rarely raced. The scripts name that many waiters
// (announce_queue in handover.lua) whenever they change who is first.
const (
	nextInLine  = 20 * time.Millisecond
	namedPlaces = 3
)

// queueLifeArg is queueLife as a script argument, converted once.
var queueLifeArg any = queueLife.Milliseconds()

// grantMsg is a release's grant to a queued waiter: the token, and the
// entry it was granted on (its last refresh, µs on the server clock) with
// how long before the grant that refresh was.
type grantMsg struct {
	token int64
	ref   int64
	age   time.Duration
}

// parseGrant reads a release message "<holder> <token> <refreshed µs> <age
// ms>"; ok is false for anything else (an empty message: the lock is free).
func parseGrant(payload string) (holder string, g grantMsg, ok bool) {
	holder, rest, ok1 := strings.Cut(payload, " ")
	tok, rest, ok2 := strings.Cut(rest, " ")
	ref, age, ok3 := strings.Cut(rest, " ")
	if !ok1 || !ok2 || !ok3 {
		return "", g, false
	}
	var err1, err2, err3 error
	g.token, err1 = strconv.ParseInt(tok, 10, 64)
	g.ref, err2 = strconv.ParseInt(ref, 10, 64)
	ms, err3 := strconv.ParseInt(age, 10, 64)
	// An age past what a Duration holds would wrap and date the lease wrong.
	if err1 != nil || err2 != nil || err3 != nil || g.token < 1 || ms < 0 || ms > math.MaxInt64/int64(time.Millisecond) {
		return "", g, false
	}
	g.age = time.Duration(ms) * time.Millisecond
	return holder, g, true
}

// announceTail ends a script's announcement of the first waiters (see
// announce_queue in handover.lua): it makes the message read as a grant to
// nobody for the releases that knew only grants, and read any other message
// as a wake-up.
const announceTail = ": 1 0 0"

// parsePlaces reads a script's announcement of the first waiters,
// "q:<remaining ms>:<first>[:<second>[:<third>]]" followed by announceTail
// (or not, as the scripts of the release before it published it); ok is
// false for any other message.
func parsePlaces(payload string) (rem time.Duration, first []string, ok bool) {
	payload = strings.TrimSuffix(payload, announceTail)
	rest, ok := strings.CutPrefix(payload, "q:")
	if !ok {
		return 0, nil, false
	}
	ms, rest, ok := strings.Cut(rest, ":")
	if !ok {
		return 0, nil, false
	}
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil || n < -2 || n > math.MaxInt64/int64(time.Millisecond) {
		return 0, nil, false
	}
	first = strings.SplitN(rest, ":", namedPlaces)
	return time.Duration(n) * time.Millisecond, first, true
}
