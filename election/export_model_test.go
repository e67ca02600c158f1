package election

import (
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/internal/lockbackend"
	"github.com/fencekit/fencekit/lock"
)

// What the election model (model_test.go) needs to build its broken
// variants: an election whose Locker's Redis backend sends the record's
// script (lock/internal/redisbackend/record_put.lua) with a line changed, or that steps down
// later than its margin says. Tests only. The record's script belongs to
// the backend, which the election reaches through the lock's contract.

// recordPutter is the Redis backend's hook for the model's controls.
type recordPutter interface {
	UseRecordPut(src string) string
	RecordPutHash() string
	RecordPutSource() string
}

func putter(e *Election) recordPutter { return lockbackend.Of(e.locker).(recordPutter) }

// SetLeaderSource returns the record's script as the Redis backend sends
// it (read from a Locker that sends nothing).
func SetLeaderSource() string {
	c := redis.NewClient(&redis.Options{})
	defer c.Close()
	l, err := lock.New(c, lock.WithWait(lock.Backoff(time.Millisecond, time.Millisecond)))
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return lockbackend.Of(l).(recordPutter).RecordPutSource()
}

// UseSetLeader makes e's Locker record its leaders with src instead of the
// record's script, and returns the script's hash.
func UseSetLeader(e *Election, src string) string { return putter(e).UseRecordPut(src) }

// SetLeaderHash returns the hash of the script e's Locker records leaders
// with.
func SetLeaderHash(e *Election) string { return putter(e).RecordPutHash() }

// SetStepDown sets e's step-down margin without the option's checks.
func SetStepDown(e *Election, d time.Duration) { e.margin = d }
