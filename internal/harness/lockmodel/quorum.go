package lockmodel

import (
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/fencekit/fencekit/fence"
)

// Nodes is the server's decision on a backend of independent nodes
// (Redlock), made from one read of each node: the lock is held by the
// holder a quorum of nodes holds it for, with the token a quorum of those
// nodes keeps for that grant, until the quorum's end (the quorum-th
// latest end among those nodes); the floor is the lowest node clock, below
// every later grant's token.
//
// A node that is killed loses its data. What it granted before is then
// counted as held by it until that grant would have ended there (the
// node is excused from it, as package lock's Redlock model excuses it):
// the actors' clients report each node's grants and extensions
// ([Nodes.Granted]), and a kill ([Nodes.Killed]) turns the node's grants
// into such excused holds. A node is down from its kill until
// [Nodes.Restarted]: a read of it that fails then counts as a node that
// holds nothing else. Nobody else is excused.
type Nodes struct {
	quorum int

	mu     sync.Mutex
	held   []map[string]nodeHold // per node: what the clients saw it grant
	ghosts []map[string]nodeHold // per killed node: what it granted before
	down   []bool
	counts map[string]int
}

// nodeHold is a node's grant to one holder: its token, and the latest
// moment (local clock) it may hold the lock for that holder.
type nodeHold struct {
	token fence.Token
	end   time.Time
}

// NodeRead is one node's read of a resource: its observation (Left
// counted from the read) and when its reply came, or the read's error.
type NodeRead struct {
	Observation
	Reply time.Time
	Err   error
}

// Kinds [Nodes] counts ([Nodes.Counts]).
const (
	NodesExcused = "node reads excused: the node granted the holder and then lost its data"
	NodesDown    = "node reads of a killed node (down)"
)

// NewNodes is the view of n nodes with the given quorum.
func NewNodes(n, quorum int) *Nodes {
	ns := &Nodes{quorum: quorum, held: make([]map[string]nodeHold, n), ghosts: make([]map[string]nodeHold, n),
		down: make([]bool, n), counts: map[string]int{}}
	for i := range n {
		ns.held[i], ns.ghosts[i] = map[string]nodeHold{}, map[string]nodeHold{}
	}
	return ns
}

// Granted records that node granted holder (or extended, or raised its
// grant's token): with token (0: unchanged), until end at the latest (the
// reply's moment plus the lease the node was asked for, or the remaining
// time it answered).
func (ns *Nodes) Granted(node int, holder string, token fence.Token, end time.Time) {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	into := ns.held[node]
	if ns.down[node] {
		into = ns.ghosts[node] // a reply read after the kill
	}
	h := into[holder]
	h.token = max(h.token, token)
	if end.After(h.end) {
		h.end = end
	}
	into[holder] = h
}

// Killed marks node down, its data lost, and returns the moment the last
// of its earlier grants ends: it must not serve again before then, or a
// holder could hold the lock there twice over.
func (ns *Nodes) Killed(node int) time.Time {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	ns.down[node] = true
	now := time.Now()
	last := now
	for h, g := range ns.held[node] {
		if g.end.After(now) {
			ns.ghosts[node][h] = g
			if g.end.After(last) {
				last = g.end
			}
		}
	}
	ns.held[node] = map[string]nodeHold{}
	return last
}

// Restarted marks node up again, empty.
func (ns *Nodes) Restarted(node int) {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	ns.down[node] = false
	ns.ghosts[node] = map[string]nodeHold{}
}

// Down reports whether node is down (killed, not yet restarted): its
// reader need not wait for a read that must fail.
func (ns *Nodes) Down(node int) bool {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	return ns.down[node]
}

// Counts returns what the views counted so far, by kind.
func (ns *Nodes) Counts() map[string]int {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	return maps.Clone(ns.counts)
}

// View is what a quorum of reads says, as of reply (the last read's
// reply): see [Nodes]. It fails when a node that is not down could not be
// read.
func (ns *Nodes) View(reads []NodeRead, reply time.Time) (Observation, error) {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	type vote struct {
		token fence.Token
		end   time.Time
	}
	votes := map[string][]vote{}
	var o Observation
	floorSet := false
	for i, r := range reads {
		if r.Err != nil {
			if !ns.down[i] {
				return Observation{}, fmt.Errorf("node %d: %w", i, r.Err)
			}
			ns.counts[NodesDown]++
		} else {
			if !floorSet || r.Floor < o.Floor {
				o.Floor, floorSet = r.Floor, true
			}
			if r.Holder != "" {
				end := r.Reply.Add(r.Left)
				if r.Left <= 0 {
					end = reply.Add(24 * time.Hour) // no expiry
				}
				votes[r.Holder] = append(votes[r.Holder], vote{r.Token, end})
			}
		}
		for h, g := range ns.ghosts[i] {
			if g.end.After(r.Reply) && (r.Err != nil || r.Holder != h) {
				votes[h] = append(votes[h], vote(g))
				ns.counts[NodesExcused]++
			}
		}
	}
	for h, vs := range votes {
		if len(vs) < ns.quorum {
			continue
		}
		o.Holder = h
		tokens := map[fence.Token]int{}
		for _, v := range vs {
			tokens[v.token]++
			o.Token = max(o.Token, v.token)
		}
		for tok, k := range tokens {
			if k >= ns.quorum {
				o.Token = tok
			}
		}
		ends := make([]time.Time, len(vs))
		for j, v := range vs {
			ends[j] = v.end
		}
		slices.SortFunc(ends, func(a, b time.Time) int { return b.Compare(a) })
		// A node's end is no later than its read's reply plus Left; the
		// quorum holds the lock until the quorum-th latest of them.
		o.Left = max(ends[ns.quorum-1].Sub(reply), time.Microsecond)
	}
	return o, nil
}
