package rueidisfence

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"maps"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/fencekit/fencekit/election"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/electionmodel"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
)

// The election model (internal/harness/electionmodel) on Lockers of the
// rueidis client, as package election runs it on go-redis: candidates
// campaign on one private redis-server, each through a fault proxy of its
// own and a rueidis client of its own; a record write is held before the
// record's script is sent (the adapter's test hook); the planter writes a
// record above every term's straight into the record's hash. The server's
// history is its MONITOR feed, replayed (monitor_test.go, and
// redisServerLog below, as in package election's model). The observer
// watches through rueidis too. The control is an unfenced elector (it
// believes it leads until a TTL after it last knew), which the judge must
// catch electing two leaders at once.

const modelTTL = 300 * time.Millisecond

// stepDownFloor is the least gap the judge accepts between a term's end
// and the lock's next grant once the lock ran out: a fifth of the
// documented default margin, as in package election's model.
const stepDownFloor = modelTTL / election.StepDownDivisor / 5

// recordPutHash is the SHA-1 of the record script that the election's
// record writes run.
func recordPutHash(t *testing.T) string {
	src, err := os.ReadFile("../internal/redisbackend/record_put.lua")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha1.Sum(src)
	return hex.EncodeToString(sum[:])
}

// modelClient is a rueidis client of addr for the model: short dials, and
// calls that end with their context.
func modelClient(t *testing.T, addr string) *client {
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true,
		Dialer: net.Dialer{Timeout: 100 * time.Millisecond}, DisableRetry: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close)
	return newClient(rc)
}

// runElectionModel makes one run of the model and judges it.
func runElectionModel(t *testing.T, unfenced bool, seed uint64, budget time.Duration) *electionmodel.Verdict {
	t.Helper()
	srv := testenv.StartRedis(t)
	const prefix = "el:"
	oc := srv.Client()
	ol, err := newOn(modelClient(t, srv.Addr()), []lock.Option{lock.WithPrefix(prefix)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ol.Close)
	watcher, err := election.New(ol, "model", election.WithTTL(modelTTL))
	if err != nil {
		t.Fatal(err)
	}
	var names election.RedisNames
	if !watcher.As(&names) {
		t.Fatal("not an election on Redis")
	}
	recKey := names.RecordKey
	lockKey := recKey[:len(recKey)-len(":leader")] + ":lock"
	putHash := recordPutHash(t)
	mon := startMonitor(t, srv.Addr())
	mc := electionmodel.Config{
		Backend:  "rueidis",
		TTL:      modelTTL,
		Budget:   budget,
		Seed:     seed,
		Unfenced: unfenced,
		NewCandidate: func(i int, beforeRecord func()) electionmodel.Candidate {
			p := testenv.StartProxy(t, srv.Addr())
			c := modelClient(t, p.Addr())
			c.before = func(hash string, _, _ []string) {
				if hash == putHash {
					beforeRecord()
				}
			}
			l, err := newOn(c, []lock.Option{lock.WithPrefix(prefix)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(l.Close)
			e, err := election.New(l, "model", election.WithTTL(modelTTL))
			if err != nil {
				t.Fatal(err)
			}
			return electionmodel.Candidate{Election: e, Cut: p.Block, Uncut: p.Unblock}
		},
		Observer: watcher,
		ObserverReady: func(ctx context.Context) bool {
			return oc.PubSubNumSub(ctx, names.Channel).Val()[names.Channel] >= 1
		},
		Plant: func(ctx context.Context) bool {
			tok, err := oc.HGet(ctx, recKey, "t").Uint64()
			if err != nil {
				return false // no record now
			}
			planted := strconv.FormatUint(tok+5_000_000, 10) // 5 s of the server's clock ahead
			if err := oc.HSet(ctx, recKey, "v", "planted", "t", planted, "h", "planted-holder").Err(); err != nil {
				return false
			}
			oc.PExpire(ctx, recKey, 3*modelTTL)
			return true
		},
	}
	h := electionmodel.Run(context.Background(), mc)
	return electionmodel.Judge(h, redisServerLog(mon.stop(), lockKey, recKey), stepDownFloor)
}

// TestElectionModel runs the model and requires no violation and enough
// judged, over up to four runs, as package election's model on go-redis.
func TestElectionModel(t *testing.T) {
	budget := electionmodel.Budget(t, 3*time.Second)
	floors := map[string]int{
		"terms": 4, "terms lost": 1, "terms resigned": 2, "acts": 50,
		"pairs judged (one believer)": 5, "pairs judged (tokens)": 5, "terms judged (observer)": 5,
		"record writes judged (holder)": 4, "record writes held past the TTL": 1, "records planted": 1,
		"terms run out (step-down gap judged)": 1,
	}
	electionmodel.Check(t, "rueidis", floors, 4, func(seed uint64) *electionmodel.Verdict {
		return runElectionModel(t, false, seed, budget)
	})
}

// TestElectionModelRejectsUnfenced is the negative control: an elector
// that believes it leads for a TTL after it last knew must be caught
// electing two leaders at once, in most of three seeds.
func TestElectionModelRejectsUnfenced(t *testing.T) {
	budget := electionmodel.Budget(t, 3*time.Second)
	electionmodel.Rejects(t, "rueidis", "unfenced elector", "one believer", 3, 2, func(seed uint64) *electionmodel.Verdict {
		return runElectionModel(t, true, seed, budget)
	})
}

// keyState is a key of the replay: its value (a string, or a hash's fields)
// and when it expires (zero: never).
type keyState struct {
	val    string
	fields map[string]string
	expiry time.Time
	exists bool
}

// alive reports whether the key exists at at, with slack in the direction
// that judges less: a script's time and its log line's differ by a little.
func (k *keyState) alive(at time.Time, slack time.Duration) bool {
	return k.exists && (k.expiry.IsZero() || at.Before(k.expiry.Add(slack)))
}

// redisServerLog replays the server's MONITOR feed into the model's
// events: the lock key's grants (set by a script) and releases (deleted,
// or set to another holder, while it lived), and the record's writes by a
// script with the lock key's holder then and the record they replaced.
func redisServerLog(cmds []monCmd, lockKey, recKey string) *electionmodel.ServerLog {
	const slack = 2 * time.Millisecond
	s := &electionmodel.ServerLog{ReleasesKnown: true}
	add := func(e electionmodel.Event) { s.Events = append(s.Events, e) }
	lk, rk := &keyState{}, &keyState{}
	for _, c := range cmds {
		if len(c.args) < 2 {
			continue
		}
		switch key := c.args[1]; {
		case key == lockKey:
			switch c.args[0] {
			case "SET":
				if len(c.args) >= 5 && strings.EqualFold(c.args[3], "PX") {
					// Handed over by a release, unless the lock was about to
					// run out (the log's time and the script's differ a
					// little): a grant at its end is judged for the gap.
					if lk.alive(c.at, -slack) && lk.val != c.args[2] {
						add(electionmodel.Event{Kind: electionmodel.Released, At: c.at, Holder: lk.val})
					}
					ms, _ := strconv.ParseInt(c.args[4], 10, 64)
					*lk = keyState{val: c.args[2], exists: true, expiry: c.at.Add(time.Duration(ms) * time.Millisecond)}
					if c.lua {
						add(electionmodel.Event{Kind: electionmodel.Granted, At: c.at, Holder: c.args[2]})
					}
				}
			case "PEXPIRE":
				if ms, err := strconv.ParseInt(c.args[2], 10, 64); err == nil && lk.alive(c.at, 0) {
					lk.expiry = c.at.Add(time.Duration(ms) * time.Millisecond)
				}
			case "DEL":
				if lk.alive(c.at, 0) {
					add(electionmodel.Event{Kind: electionmodel.Released, At: c.at, Holder: lk.val})
				}
				*lk = keyState{}
			}
		case key == recKey:
			switch c.args[0] {
			case "HSET":
				f := map[string]string{}
				for j := 2; j+1 < len(c.args); j += 2 {
					f[c.args[j]] = c.args[j+1]
				}
				if c.lua && f["h"] != "" && f["t"] != "" {
					tok, _ := strconv.ParseUint(f["t"], 10, 64)
					e := electionmodel.Event{Kind: electionmodel.Recorded, At: c.at, Holder: f["h"], Token: fence.Token(tok), Value: f["v"]}
					if lk.alive(c.at, slack) {
						e.LockHolder = lk.val
					}
					if rk.alive(c.at, -slack) {
						was, _ := strconv.ParseUint(rk.fields["t"], 10, 64)
						e.Replaced = &electionmodel.Record{Token: fence.Token(was), Holder: rk.fields["h"]}
					}
					add(e)
				}
				if !rk.alive(c.at, 0) {
					*rk = keyState{exists: true, fields: map[string]string{}}
				}
				maps.Copy(rk.fields, f)
			case "PEXPIRE":
				if ms, err := strconv.ParseInt(c.args[2], 10, 64); err == nil && rk.alive(c.at, 0) {
					rk.expiry = c.at.Add(time.Duration(ms) * time.Millisecond)
				}
			case "DEL":
				*rk = keyState{}
			}
		}
	}
	return s
}
