package lock

import (
	"fmt"
	"github.com/fencekit/fencekit/lock/internal/redisbackend"
	"time"
)

// SetRedlockTrace makes every Redlock grant and extension report a line
// about itself to f, keyed by the lease's holder id; nil stops it. Tests
// only: it is not safe to call while Lockers run.
func SetRedlockTrace(f func(holder, line string)) {
	if f == nil {
		redisbackend.RedlockTrace = nil
		return
	}
	redisbackend.RedlockTrace = func(holder, op string, sent time.Time, ttl time.Duration, replies string, valid time.Duration) {
		f(holder, fmt.Sprintf("%s ttl %v sent %s valid %v (until %s) replies %s",
			op, ttl, sent.Format("15:04:05.000000"), valid, sent.Add(valid).Format("15:04:05.000000"), replies))
	}
}
