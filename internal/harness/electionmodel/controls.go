package electionmodel

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/election"
	"github.com/fencekit/fencekit/internal/lockbackend"
	"github.com/fencekit/fencekit/lock"
)

// The controls of the election model on a Redis backend, whichever client
// library its Lockers use (go-redis in package election's tests, rueidis
// in lock/rueidisfence's): the broken variants are defined here once, so
// that a change of the record's script updates them for every client.
// They reach the Redis backend's record script through the Locker
// (lockbackend.Of), which needs no hook in package election.

// Variant says how a run's candidates differ from the real election; the
// zero Variant is the real one.
type Variant struct {
	// Unfenced makes the candidates believe they lead until a while after
	// they last knew ([Config.Unfenced]).
	Unfenced bool
	// RecordPut, if set, is the source of a record script that the
	// candidates' Lockers send in place of the Redis backend's.
	RecordPut string
	// StepDown, if positive, is the candidates' step-down margin.
	StepDown time.Duration
}

// Control is a broken variant that the judge must reject with a violation
// whose text starts with Kind.
type Control struct {
	Name, Kind string
	Variant
}

// The lines of the Redis record script that the controls take out: the
// check that the writer holds the lock, and the refusal of a record below
// the live one.
const (
	recordHolderCheck = "if not ok or cur ~= ARGV[1] then\n  return 0\nend"
	recordTokenCheck  = "if was > token or (was == token and rec[2] ~= ARGV[1]) then"
)

// RedisControls returns the election model's controls on a Redis backend
// for terms of ttl: an unfenced elector, the record script without its
// holder check, without its newer-record check, or taking a record of its
// own token from another holder (a twin's), and a step-down margin of the
// drift allowance alone. It fails when a line a control takes out
// is no longer in the script (the control would run the real one).
func RedisControls(ttl time.Duration) ([]Control, error) {
	src := RecordPutSource()
	without := func(old, new string) (string, error) {
		if !strings.Contains(src, old) {
			return "", fmt.Errorf("the record script no longer holds %q: update the control", old)
		}
		return strings.Replace(src, old, new, 1), nil
	}
	noHolder, err := without(recordHolderCheck, "")
	if err != nil {
		return nil, err
	}
	lower, err := without(recordTokenCheck, "if false then")
	if err != nil {
		return nil, err
	}
	twin, err := without(recordTokenCheck, "if was > token then")
	if err != nil {
		return nil, err
	}
	return []Control{
		{"unfenced elector", "one believer", Variant{Unfenced: true}},
		{"record written without the holder check", "record holder", Variant{RecordPut: noHolder}},
		{"record admitted below a newer one", "record token", Variant{RecordPut: lower}},
		{"record admitted over a twin", "record token", Variant{RecordPut: twin}},
		{"step-down within the drift allowance", "step-down", Variant{StepDown: election.Drift(ttl)}},
	}, nil
}

// recordPutter is what the Redis backend offers the election model's
// controls (lock/internal/redisbackend/record.go).
type recordPutter interface {
	UseRecordPut(src string) string
	RecordPutHash() string
	RecordPutSource() string
}

func putterOf(l *lock.Locker) (recordPutter, error) {
	p, ok := lockbackend.Of(l).(recordPutter)
	if !ok {
		return nil, errors.New("electionmodel: the Locker's backend is not a single Redis deployment's")
	}
	return p, nil
}

// RecordPutSource returns the Redis backend's record script, as its
// Lockers send it (read from a Locker that sends nothing).
func RecordPutSource() string {
	c := redis.NewClient(&redis.Options{})
	defer c.Close()
	l, err := lock.New(c, lock.WithWait(lock.Backoff(time.Millisecond, time.Millisecond)))
	if err != nil {
		panic(err)
	}
	defer l.Close()
	p, err := putterOf(l)
	if err != nil {
		panic(err)
	}
	return p.RecordPutSource()
}

// NewElection returns the election name on l with terms of ttl, as v's
// candidates run it (l then sends v's record script, if any), and the
// hash of the record script l sends, by which a client's hook knows a
// record write.
func (v Variant) NewElection(l *lock.Locker, name string, ttl time.Duration) (*election.Election, string, error) {
	opts := []election.Option{election.WithTTL(ttl)}
	if v.StepDown > 0 {
		opts = append(opts, election.WithStepDown(v.StepDown))
	}
	e, err := election.New(l, name, opts...)
	if err != nil {
		return nil, "", err
	}
	p, err := putterOf(l)
	if err != nil {
		return nil, "", err
	}
	if v.RecordPut != "" {
		return e, p.UseRecordPut(v.RecordPut), nil
	}
	return e, p.RecordPutHash(), nil
}
