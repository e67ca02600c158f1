package election

import (
	"context"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/internal/lockbackend"
	"github.com/fencekit/fencekit/lock"
)

// readMeRecorder is a Recorder over Redis whose watch reports every write
// as a zero Record, as a backend whose single announcement cannot vouch for
// a quorum (Redlock) does: "read the record". Its read runs the function
// armed, if any, after reading: a write made then is announced after the
// read, and its announcement is waiting in the watch when the read returns.
type readMeRecorder struct {
	lockbackend.Recorder
	armed     chan func()
	announced chan struct{} // a zero Record was put in the watch
}

func (r *readMeRecorder) WatchRecord(ctx context.Context, resource string) <-chan lockbackend.Record {
	in := r.Recorder.WatchRecord(ctx, resource)
	out := make(chan lockbackend.Record, 16)
	go func() {
		defer close(out)
		for range in {
			out <- lockbackend.Record{}
			select {
			case r.announced <- struct{}{}:
			default:
			}
		}
	}()
	return out
}

func (r *readMeRecorder) ReadRecord(ctx context.Context, resource string) (lockbackend.Record, error) {
	rec, err := r.Recorder.ReadRecord(ctx, resource)
	select {
	case f := <-r.armed:
		f()
	default:
	}
	return rec, err
}

// TestObserveReadsAfterReadMeWhileDraining: an observer that reads the
// leader and then finds, among the announcements received meanwhile, a
// "read the record" one (a zero Record) reads again, since that write may
// have come after its read. An observer that dropped it learned of the new
// leader only at its next periodic read, up to a third of the TTL later;
// here periodic reads are an hour apart, so it would never learn of it.
func TestObserveReadsAfterReadMeWhileDraining(t *testing.T) {
	c := testenv.Redis(t)
	l, err := lock.New(c, lock.WithPrefix(testenv.Prefix(t)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	candidates, err := New(l, "readme", WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	watcher, err := New(l, "readme", WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	rec := &readMeRecorder{Recorder: watcher.rec, armed: make(chan func(), 1), announced: make(chan struct{}, 16)}
	watcher.rec, watcher.readEvery = rec, time.Hour

	a, err := candidates.Campaign(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	var b *Term
	// The observer's first read finds a; then, before that read returns,
	// a resigns and b is elected, and b's announcement reaches the watch.
	rec.armed <- func() {
		for deadline := time.Now().Add(10 * time.Second); c.PubSubNumSub(ctx, electionKeys(watcher).Channel).Val()[electionKeys(watcher).Channel] < 1; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Error("observer not subscribed after 10s")
				return
			}
		}
		for len(rec.announced) > 0 {
			<-rec.announced
		}
		if err := a.Resign(ctx); err != nil {
			t.Error(err)
			return
		}
		if b, err = candidates.Campaign(ctx, "b"); err != nil {
			t.Error(err)
			return
		}
		select {
		case <-rec.announced:
		case <-time.After(10 * time.Second):
			t.Error("b's election not announced within 10s")
		}
	}
	seen := watcher.Observe(ctx)
	if first := <-seen; first.Value != "a" || first.Token != a.Fence().Token {
		t.Fatalf("first report %+v, want a's term (token %d)", first, a.Fence().Token)
	}
	select {
	case next := <-seen:
		if b == nil || next.Value != "b" || next.Token != b.Fence().Token {
			t.Fatalf("second report %+v, want b's term", next)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("b's term not reported within 10s: the observer dropped its \"read the record\" announcement")
	}
	_ = b.Resign(ctx)
}
