package rueidisfence

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/lockmodel"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/lock"
	"github.com/fencekit/fencekit/lock/internal/redisbackend"
)

// The lock model (internal/harness/lockmodel) on Redlock Lockers of the
// rueidis client: five private redis-servers, each actor's Locker with a
// rueidis client of its own per node. The watcher reads the resource's
// keys on every node (through go-redis, each node in one script) and
// takes as the server's decision what a quorum says (lockmodel.Nodes):
// the lock is held by the holder a quorum of nodes holds it for, with the
// token a quorum of those nodes keeps for that grant (the lease's token is
// the largest its nodes issued, raised on the others, and handed out only
// once a quorum holds token state at it), until the quorum's end; the
// floor is the lowest node clock, below every later grant's token (each
// node's token is at least its clock, and the lease's is the largest of a
// quorum's). Every promise is judged against the quorum's end with
// Redlock's drift allowance (a quorum holds a lease ttl/100 + 2 ms past
// the validity its holder is told); the leases are four times the model's
// usual ones, so that the allowance outgrows the time a grant takes.
// Redlock keeps no queue (its waiters poll), so the queue is not judged.
//
// The faults are the actors' clients losing commands to a node (the
// request, or its reply) for a while; node 0's token state written ahead,
// as a node whose clock runs ahead leaves it: later tokens must still rise
// on every quorum; and two nodes killed, one while the other is down
// (their data lost), each started again empty once what it granted
// before has ended. A node that granted a lease
// and then lost its data is excused from that lease's promise (it counts
// as holding it until its grant would have ended there), as package lock's
// Redlock model excuses it, and a token pair across the loss is excused
// when the earlier token was ahead of the clock; nothing else is.

// redlockNodes is the number of servers of the Redlock model.
const redlockNodes = 5

// redlockModel is the Redlock model's servers and what its variants
// change in the actors' clients.
type redlockModel struct {
	t      *testing.T
	prefix string
	nodes  []*modelNode
	quorum int
	// swap maps a script's name (redisbackend.ModelScripts) to a source
	// sent in its place; misread, if set, reads each reply of the named
	// script in place of the adapter (a control's broken adapter).
	swap    map[string]string
	misread func(script string, r *reply)

	// view is the quorum's decision, with the nodes' grants as the
	// actors' clients saw them (a killed node's excuse).
	view *lockmodel.Nodes

	resource atomic.Value // the resource of the run under way (string)
	ahead    *lock.Locker // a single-node Locker of node 0
	skew     atomic.Int64 // how far ahead node 0's token state was written, µs

	mu      sync.Mutex
	clients []rueidis.Client // the run's actors' clients, closed at its end
}

// modelNode is one server of the Redlock model.
type modelNode struct {
	srv     *testenv.RedisServer
	watcher *redis.Client
	flaky   atomic.Bool // the actors' clients lose commands to it
	rng     *rand.Rand
	rngMu   sync.Mutex
}

func (n *modelNode) draw(k int) int {
	n.rngMu.Lock()
	defer n.rngMu.Unlock()
	return n.rng.IntN(k)
}

func newRedlockModel(t *testing.T) *redlockModel {
	m := &redlockModel{t: t, prefix: "rlmodel:" + fence.NewHolder()[:12] + ":", quorum: redlockNodes/2 + 1,
		view: lockmodel.NewNodes(redlockNodes, redlockNodes/2+1)}
	m.skew.Store(int64(24 * time.Hour / time.Microsecond))
	for i := range redlockNodes {
		srv := testenv.StartRedis(t)
		m.nodes = append(m.nodes, &modelNode{srv: srv, watcher: srv.Client(), rng: rand.New(rand.NewPCG(uint64(i), 7))})
	}
	ahead, err := New(rueidisClient(t, m.nodes[0].srv.Addr()), lock.WithPrefix(m.prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ahead.Close)
	m.ahead = ahead
	return m
}

// keys are a resource's keys on each node: the lock, its token state,
// and the queue's (Redlock has none; the observation reads them anyway).
func (m *redlockModel) keys(resource string) []string {
	base := m.prefix + "{" + resource + "}"
	return []string{base + ":lock", base + ":token", base + ":queue", base + ":waiting"}
}

func (m *redlockModel) backend(name string, faults bool) lockmodel.Backend {
	b := lockmodel.Backend{
		Name:    name,
		Locker:  m.locker,
		Observe: m.observe,
		Drift:   lockmodel.RedlockDrift,
		Close: func() {
			m.mu.Lock()
			cs := m.clients
			m.clients = nil
			m.mu.Unlock()
			for _, c := range cs {
				c.Close()
			}
		},
	}
	if faults {
		b.Faults = []lockmodel.Fault{
			{Name: "a node loses commands", Limit: 3, Inject: m.loseCommands},
			{Name: "node 0's token state written ahead", Limit: 3, Inject: m.writeAhead},
			{Name: "two nodes killed", Limit: 2, Inject: m.kill, LosesState: true},
		}
	}
	return b
}

// locker is an actor's Redlock Locker: a rueidis client of its own per
// node. It calls no seen: a Redlock try sends one holder id to every node,
// and the model's pause of a queued waiter's later tries does not apply.
func (m *redlockModel) locker(int, func(string)) (*lock.Locker, error) {
	scripts := redisbackend.ModelScripts()
	var cs []redisbackend.Client
	for i, n := range m.nodes {
		rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{n.srv.Addr()}, DisableCache: true,
			DisableRetry: true, Dialer: net.Dialer{Timeout: 100 * time.Millisecond}})
		if err != nil {
			return nil, err
		}
		m.mu.Lock()
		m.clients = append(m.clients, rc)
		m.mu.Unlock()
		cs = append(cs, &nodeClient{client: newClient(rc), m: m, n: n, idx: i, scripts: scripts})
	}
	return newRedlockOn(cs, []lock.Option{lock.WithPrefix(m.prefix)})
}

// observe reads resource on every node and returns what a quorum says.
func (m *redlockModel) observe(ctx context.Context, resource string) (lockmodel.Observation, error) {
	m.resource.Store(resource)
	reads := make([]lockmodel.NodeRead, len(m.nodes))
	for i, n := range m.nodes {
		if m.view.Down(i) {
			reads[i] = lockmodel.NodeRead{Reply: time.Now(), Err: errDown}
			continue
		}
		o, err := lockmodel.ObserveRedis(ctx, n.watcher, m.keys(resource))
		reads[i] = lockmodel.NodeRead{Observation: o, Reply: time.Now(), Err: err}
	}
	return m.view.View(reads, time.Now())
}

// kill kills two nodes (their data lost), the second 100-200 ms after
// the first, while the first is down: a lease granted meanwhile holds on
// three nodes, or four, of which the second kill takes one. Each starts
// again empty once every grant it made has ended (at least 300 ms after
// its kill), whether ctx ended or not: the nodes must come back.
func (m *redlockModel) kill(context.Context) error {
	first := m.nodes[0].draw(len(m.nodes))
	second := (first + 1 + m.nodes[0].draw(len(m.nodes)-1)) % len(m.nodes)
	up := make([]time.Time, 2)
	for k, i := range []int{first, second} {
		if k == 1 {
			time.Sleep(time.Duration(100+m.nodes[0].draw(100)) * time.Millisecond)
		}
		last := m.view.Killed(i)
		m.nodes[i].srv.Kill()
		up[k] = later(last.Add(50*time.Millisecond), time.Now().Add(300*time.Millisecond))
	}
	for k, i := range []int{first, second} {
		time.Sleep(time.Until(up[k]))
		m.nodes[i].srv.Restart()
		m.view.Restarted(i)
	}
	return nil
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// loseCommands makes the actors' clients lose commands to one node for a
// while.
func (m *redlockModel) loseCommands(ctx context.Context) error {
	n := m.nodes[m.nodes[0].draw(len(m.nodes))]
	n.flaky.Store(true)
	defer n.flaky.Store(false)
	t := time.NewTimer(time.Duration(150+n.draw(250)) * time.Millisecond)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	return nil
}

// writeAhead advances node 0's token state of the run's resource further
// ahead of the clock each time.
func (m *redlockModel) writeAhead(ctx context.Context) error {
	resource, _ := m.resource.Load().(string)
	if resource == "" {
		return nil
	}
	skew := m.skew.Add(int64(m.nodes[0].draw(1_000_000_000)))
	actx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return m.ahead.Advance(actx, resource, fence.Token(time.Now().UnixMicro()+skew))
}

// nodeClient is an actor's command interface to one node: the adapter,
// with the node's faults and the variant's changes.
type nodeClient struct {
	*client
	m       *redlockModel
	n       *modelNode
	idx     int
	scripts map[string]string // hash → name
}

var (
	errLost = errors.New("model: command lost")
	errDown = errors.New("model: node killed")
)

func (c *nodeClient) Run(ctx context.Context, src string, args []any) redisbackend.Reply {
	hash, _ := args[1].(string)
	name := c.scripts[hash]
	if b := c.m.swap[name]; b != "" {
		sum := sha1.Sum([]byte(b))
		args = slices.Clone(args)
		args[1], src = hex.EncodeToString(sum[:]), b
	}
	if c.n.flaky.Load() {
		switch c.n.draw(4) {
		case 0: // the request is lost
			return c.lost(ctx)
		case 1: // it ran, and its reply is lost
			_ = c.client.Run(ctx, src, args)
			return c.lost(ctx)
		}
	}
	r := c.client.Run(ctx, src, args)
	rr, ok := r.(*reply)
	if ok && c.m.misread != nil && rr.err == nil {
		c.m.misread(name, rr)
	}
	if ok && rr.err == nil {
		c.record(name, args, rr.val, time.Now())
	}
	return r
}

// record tells the view what the node granted, as this client read it:
// a grant (until the reply plus the lease asked for), an extension (plus
// what the node said is left) or a raise of the grant's token.
func (c *nodeClient) record(name string, args []any, val any, at time.Time) {
	n, _ := args[2].(int)
	if len(args) < 3+n+2 {
		return
	}
	holder, err := argString(args[3+n])
	if err != nil {
		return
	}
	arg, err := argString(args[4+n])
	if err != nil {
		return
	}
	num, err := strconv.ParseInt(arg, 10, 64)
	if err != nil {
		return
	}
	switch v := val.(type) {
	case []any:
		if name == "acquire" && len(v) >= 2 && v[0] == int64(1) {
			if tok, ok := v[1].(int64); ok {
				c.m.view.Granted(c.idx, holder, fence.Token(tok), at.Add(time.Duration(num)*time.Millisecond))
			}
		}
	case int64:
		switch {
		case name == "extend" && v > 0:
			c.m.view.Granted(c.idx, holder, 0, at.Add(time.Duration(v)*time.Millisecond))
		case name == "raise" && v == 1:
			c.m.view.Granted(c.idx, holder, fence.Token(num), time.Time{})
		}
	}
}

// lost is a command that got no reply: it ends with ctx (the node
// timeout), or after 200 ms.
func (c *nodeClient) lost(ctx context.Context) redisbackend.Reply {
	t := time.NewTimer(200 * time.Millisecond)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	return &reply{err: errLost}
}

// redlockModelFloors are the Redlock model's floors: the queue is not
// judged, and renewals are counted, not required (a fault within a second
// of a renewed lease leaves it unjudged, and faults come often).
func redlockModelFloors() map[string]int {
	f := lockmodel.DefaultFloors()
	for _, k := range []string{lockmodel.Queue, lockmodel.WaiterAhead, lockmodel.FreeWithWaiter, lockmodel.Renewal} {
		delete(f, k)
	}
	return f
}

// TestRedlockModel runs the lock model on Redlock Lockers of the rueidis
// client, with faults, and judges every check with its floor.
func TestRedlockModel(t *testing.T) {
	m := newRedlockModel(t)
	floors := redlockModelFloors()
	floors["faults: two nodes killed"] = 1
	r := lockmodel.Run(t, m.backend("rueidis-redlock", true), lockmodel.Config{Floors: floors, Faults: true, LeaseScale: 4})
	for k, n := range m.view.Counts() {
		r.Add(k, n)
	}
	r.Report(t)
	r.Check(t, floors)
}

// TestRedlockModelControls runs the Redlock model on four broken
// variants, each of which must be rejected in most of its runs: tokens
// issued without their clock anchor (package lock's Redlock control, its
// acquire script sent with the anchor cut), caught by the anchor or token
// checks; an adapter that reads a node's refusal as a grant, so that a
// quorum counts nodes that never granted, caught by the promise or token
// checks; and one that reads an extension's remaining time as ten times
// what the node said, so that an extended lease believes itself held past
// a quorum's expiry, caught by the promise check; and nodes that hold each
// grant the drift allowance less than asked (as a validity counted
// without it), caught by the promise check's drift allowance.
func TestRedlockModelControls(t *testing.T) {
	m := newRedlockModel(t)
	install := func(swap map[string]string, misread func(string, *reply)) func(testing.TB) (lockmodel.Backend, func()) {
		return func(testing.TB) (lockmodel.Backend, func()) {
			m.swap, m.misread = swap, misread
			return m.backend("rueidis-redlock", false), func() { m.swap, m.misread = nil, nil }
		}
	}
	cs := []lockmodel.Control{{
		Name:     "tokens without their clock anchor",
		CaughtBy: []string{lockmodel.Anchor, lockmodel.Tokens},
		Install:  install(map[string]string{"acquire": unanchoredAcquire(t)}, nil),
	}, {
		Name:     "refusals read as grants",
		CaughtBy: []string{lockmodel.Promise, lockmodel.Tokens},
		Install:  install(nil, refusalsAsGrants),
	}, {
		Name:     "extensions misread",
		CaughtBy: []string{lockmodel.Promise},
		Install:  install(nil, extensionsTimesTen),
	}, {
		Name:     "nodes holding the drift allowance less",
		CaughtBy: []string{lockmodel.Promise},
		Install:  install(map[string]string{"acquire": driftlessAcquire(t)}, nil),
	}}
	lockmodel.RunControls(t, cs, lockmodel.Budget(t), lockmodel.Config{LeaseScale: 4})
}

// unanchoredAcquire is the acquire script with its tokens cut from the
// clock: the next token is the counter's successor, so a node without
// token state issues 1.
func unanchoredAcquire(t *testing.T) string {
	return lockmodel.Edited(t, redisbackend.ModelScriptSource("acquire"), "the token's clock anchor",
		"local t = math.max(n + 1, now)", "local t = n + 1")
}

// driftlessAcquire is the acquire script with each node's lease shortened
// by Redlock's drift allowance (ttl/100 + 2 ms): a quorum then holds a
// lease no longer than the validity its holder is told, as with a
// validity counted without the allowance.
func driftlessAcquire(t *testing.T) string {
	return lockmodel.Edited(t, redisbackend.ModelScriptSource("acquire"), "the lease's length",
		"local lease = tonumber(ARGV[2])", "local lease = tonumber(ARGV[2]) - math.floor(tonumber(ARGV[2]) / 100) - 2")
}

// refusalsAsGrants reads an acquire's refusal ({0, remaining ms}) as a
// grant of a token from the local clock.
func refusalsAsGrants(script string, r *reply) {
	if v, ok := r.val.([]any); ok && script == "acquire" && len(v) == 2 && v[0] == int64(0) {
		r.val = []any{int64(1), time.Now().UnixMicro()}
	}
}

// extensionsTimesTen reads an extension's remaining milliseconds as ten
// times what the node said.
func extensionsTimesTen(script string, r *reply) {
	if ms, ok := r.val.(int64); ok && script == "extend" && ms > 0 {
		r.val = ms * 10
	}
}
