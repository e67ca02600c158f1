package etcdtest

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/lockbackend"
)

// TestRecordWatchResumesAfterCompaction observes a resource's record
// through a member's proxy, compacts the cluster past the last record
// event the watch saw, and breaks the watch for a second while a new term
// writes its record. Once the watch is back, the observer must hear the
// term written while it was cut off (read as the current record: its
// event was compacted away) and every term after. Its control, a watch
// that resumes from the compaction's revision without reading the record
// (ResumeCompactedUnread), must never hear that term.
func TestRecordWatchResumesAfterCompaction(t *testing.T) {
	for _, broken := range []bool{false, true} {
		t.Run(map[bool]string{false: "sound", true: "control"}[broken], func(t *testing.T) {
			recordWatchAfterCompaction(t, broken)
		})
	}
}

func recordWatchAfterCompaction(t *testing.T, broken bool) {
	c := StartCluster(t, 1)
	m := c.Members[0]
	watcher := newBackend(t, c.ClientOf(t, m.ClientURL()))
	watcher.ResumeCompactedUnread = broken
	direct := c.ClientOf(t, m.DirectURL())
	writer := newBackendAt(t, direct, watcher)
	ctx := ctxFor(t, 60*time.Second)
	recs := watcher.WatchRecord(ctx, "e")
	// A term: a grant that writes its record, then ends (or, with
	// hold, ends when end is called).
	start := func(v string) (fence.Token, func()) {
		t.Helper()
		r := req("e", 10*time.Second)
		g := mustGrant(t, writer, r)
		if err := writer.PutRecord(ctx, fence.Fence{Resource: "e", Token: g.Token, Holder: r.Holder}, v, 0); err != nil {
			t.Fatal(err)
		}
		return g.Token, func() {
			if err := writer.Release(ctx, g.Hold); err != nil {
				t.Fatal(err)
			}
		}
	}
	term := func(v string) fence.Token {
		t.Helper()
		tok, end := start(v)
		end()
		return tok
	}
	hear := func(want fence.Token, v string) {
		t.Helper()
		deadline := time.After(15 * time.Second)
		for {
			select {
			case rec, ok := <-recs:
				if !ok {
					t.Fatal("the record watch ended")
				}
				if rec.Token == want && rec.Value == v {
					return
				}
			case <-deadline:
				t.Fatalf("the observer never heard term %d (%q)", want, v)
			}
		}
	}
	hear(term("before"), "before")
	// Other writes, then a compaction past the last record event.
	for i := range 10 {
		if _, err := direct.Put(ctx, watcher.Prefix()+"filler", fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := direct.Get(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	// The watch is cut for a second; meanwhile a term begins and writes
	// its record, and the cluster compacts past it.
	m.Proxy.CutFor(time.Second)
	cutTerm, end := start("while cut off")
	// Past the term's record too: a write after it, and the compaction
	// at that write's revision.
	past, err := direct.Put(ctx, watcher.Prefix()+"filler", "past")
	if err != nil {
		t.Fatal(err)
	}
	if past.Header.Revision <= resp.Header.Revision+2 {
		t.Fatalf("the term's record was not written after revision %d", resp.Header.Revision)
	}
	if _, err := direct.Compact(ctx, past.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	if broken {
		// The term stands until end: a watch that resumed without the
		// read never reports it, whatever comes after.
		deadline := time.After(5 * time.Second)
		for {
			select {
			case rec, ok := <-recs:
				if ok && rec.Token == cutTerm {
					t.Fatalf("a watch resumed past the compaction unread reported term %d: the control shows nothing", cutTerm)
				}
				if ok {
					continue
				}
			case <-deadline:
			}
			break
		}
		end()
		after := term("after")
		hear(after, "after")
		t.Logf("rejected as it must be: term %d, written while the watch was cut, never heard; term %d after it was", cutTerm, after)
		return
	}
	hear(cutTerm, "while cut off")
	end()
	for i := range 3 {
		v := fmt.Sprint("after ", i)
		hear(term(v), v)
	}
}

// TestWatchesBackOffWithoutLeader stops the peers of the member that a
// process's client reaches, so that it has no leader and refuses every
// watch that requires one at once: a waiter's watch and an observer's
// must start again with a backoff, not thousands of times in 5 s.
func TestWatchesBackOffWithoutLeader(t *testing.T) {
	c := StartCluster(t, 3)
	leader := c.Leader(t)
	m := c.Members[(leader+1)%len(c.Members)]
	var streams atomic.Int64
	cfg := clientConfig(m.ClientURL())
	cfg.DialOptions = []grpc.DialOption{grpc.WithStreamInterceptor(
		func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			if strings.HasSuffix(method, "/Watch") {
				streams.Add(1)
			}
			return streamer(ctx, desc, cc, method, opts...)
		})}
	cli, err := clientv3.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	b := newBackend(t, cli)
	ctx := ctxFor(t, 60*time.Second)
	w := b.Join("s", fence.NewHolder(), true)
	defer w.Leave(false)
	var _ lockbackend.Waiter = w
	recs := b.WatchRecord(ctx, "s")
	go func() {
		for range recs {
		}
	}()
	// The member's peers stop: it notices it lost its leader after an
	// election timeout, and can win no election alone.
	for i, o := range c.Members {
		if o != m {
			c.Stop(i)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for c.memberLeader(m) != 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if c.memberLeader(m) != 0 {
		t.Fatal("the member kept a leader with both its peers stopped")
	}
	time.Sleep(time.Second)
	from := streams.Load()
	time.Sleep(5 * time.Second) // the span judged
	n := streams.Load() - from
	t.Logf("%d watch streams opened in 5 s by a waiter and an observer on a member with no leader", n)
	if n > 20 {
		t.Fatalf("%d watch streams in 5 s on a member with no leader: the watches spin", n)
	}
}
