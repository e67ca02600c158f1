package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/election"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lock"
	"github.com/fencekit/fencekit/migrations"
)

// parentConfig is the run that starts the members and stops (or kills)
// their leader.
type parentConfig struct {
	member   memberConfig // Name unset
	members  int
	pause    time.Duration
	failover int
	verbose  bool // with failover, print the members' lines too
	args     []string
	out      io.Writer
}

// event is a line a member printed, when the parent read it.
type event struct {
	line string
	at   time.Time
}

var (
	firstBeat = regexp.MustCompile(`^(\S+): term (\d+): first heartbeat$`)
	leadsLine = regexp.MustCompile(`^(\S+): leads, term (\d+)$`)
)

// proc is a running member.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
}

type parent struct {
	cfg     parentConfig
	outMu   sync.Mutex
	events  chan event
	procs   map[string]*proc
	next    int
	stopped string // the member stopped with SIGSTOP, until it is resumed

	beatMu  sync.Mutex
	beats   map[fence.Token]event     // each term's first heartbeat: its member, when it was read
	elected map[fence.Token]time.Time // when each term's member said it leads
}

// firstBeatAfter returns the earliest first heartbeat of a term above
// token, if any.
func (p *parent) firstBeatAfter(token fence.Token) (fence.Token, event, bool) {
	p.beatMu.Lock()
	defer p.beatMu.Unlock()
	var best fence.Token
	var ev event
	for t, e := range p.beats {
		if t > token && (best == 0 || e.at.Before(ev.at)) {
			best, ev = t, e
		}
	}
	return best, ev, best != 0
}

// writingLeader waits until the election's leader has written its first
// heartbeat, and returns it.
func (p *parent) writingLeader(ctx context.Context, e *election.Election) (election.Leader, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		l, err := e.Leader(ctx)
		if err == nil {
			p.beatMu.Lock()
			_, wrote := p.beats[l.Token]
			p.beatMu.Unlock()
			if wrote {
				return l, nil
			}
		}
		if time.Now().After(deadline) {
			return election.Leader{}, fmt.Errorf("no leader wrote a heartbeat within 30s (last: %v, %v)", l, err)
		}
		select {
		case <-ctx.Done():
			return election.Leader{}, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// waitBeatAfter waits for the first heartbeat of a term above token.
func (p *parent) waitBeatAfter(ctx context.Context, token fence.Token) (fence.Token, event, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		if t, ev, ok := p.firstBeatAfter(token); ok {
			return t, ev, nil
		}
		if time.Now().After(deadline) {
			return 0, event{}, fmt.Errorf("no heartbeat of a term after %d within 30s", token)
		}
		select {
		case <-ctx.Done():
			return 0, event{}, ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

func (p *parent) say(format string, args ...any) {
	p.outMu.Lock()
	defer p.outMu.Unlock()
	fmt.Fprintf(p.cfg.out, format, args...)
}

func runParent(ctx context.Context, cfg parentConfig) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, cfg.member.PostgresURL)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		return &unreachableError{"PostgreSQL", "-postgres", err}
	}
	defer pool.Close()
	client := redis.NewClient(&cfg.member.Redis)
	defer client.Close()
	if err := client.Ping(ctx).Err(); err != nil {
		return &unreachableError{"Redis", "-redis", err}
	}
	if err := migrations.UpPool(ctx, pool); err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	for _, q := range []string{createHeartbeat, createBeats} {
		if _, err := pool.Exec(ctx, q); err != nil {
			return err
		}
	}
	locker, err := lock.New(client, lock.WithPrefix(cfg.member.LockPrefix))
	if err != nil {
		return err
	}
	defer locker.Close()
	e, err := election.New(locker, cfg.member.Election, election.WithTTL(cfg.member.TTL))
	if err != nil {
		return err
	}

	mode := "fenced"
	if cfg.member.Unfenced {
		mode = "unfenced"
	}
	p := &parent{cfg: cfg, events: make(chan event, 256), procs: map[string]*proc{}, beats: map[fence.Token]event{}, elected: map[fence.Token]time.Time{}}
	p.say("election %s: %d members, TTL %v, heartbeat every %v, %s\n", cfg.member.Election, cfg.members, cfg.member.TTL, cfg.member.Beat, mode)
	defer p.stopAll()
	for range cfg.members {
		if err := p.start(); err != nil {
			return err
		}
	}
	if cfg.failover > 0 {
		return p.failovers(ctx, e)
	}
	return p.pauseLeader(ctx, e, e.Observe(ctx), pool)
}

// start starts one more member.
func (p *parent) start() error {
	p.next++
	name := "member-" + strconv.Itoa(p.next)
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	m := p.cfg.member
	args := []string{"-member", name, "-election", m.Election, "-postgres", m.PostgresURL, "-redis", m.Redis.Addr,
		"-lock-prefix", m.LockPrefix, "-ttl", m.TTL.String(), "-beat", m.Beat.String()}
	if m.Unfenced {
		args = append(args, "-unfenced")
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), memberEnv+"=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	pr := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	p.procs[name] = pr
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			at := time.Now()
			if p.cfg.failover == 0 || p.cfg.verbose {
				p.say("  %s\n", sc.Text())
			}
			if m := leadsLine.FindStringSubmatch(sc.Text()); m != nil {
				t, _ := strconv.ParseUint(m[2], 10, 64)
				p.beatMu.Lock()
				p.elected[fence.Token(t)] = at
				p.beatMu.Unlock()
			}
			if m := firstBeat.FindStringSubmatch(sc.Text()); m != nil {
				t, _ := strconv.ParseUint(m[2], 10, 64)
				p.beatMu.Lock()
				p.beats[fence.Token(t)] = event{m[1], at}
				p.beatMu.Unlock()
			}
			select {
			case p.events <- event{sc.Text(), at}:
			default: // nobody is waiting for this one
			}
		}
		_ = cmd.Wait()
		close(pr.done)
	}()
	return nil
}

// stopAll ends every member: SIGCONT (for a stopped one), SIGTERM, and
// SIGKILL for one that does not exit in time.
func (p *parent) stopAll() {
	for name, pr := range p.procs {
		if name == p.stopped {
			_ = pr.cmd.Process.Signal(syscall.SIGCONT)
		}
		_ = pr.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, pr := range p.procs {
		select {
		case <-pr.done:
		case <-time.After(5 * time.Second):
			_ = pr.cmd.Process.Kill()
			<-pr.done
		}
	}
}

// nextLeader waits for a leader with a token above after, as the observer
// reports it.
func nextLeader(ctx context.Context, leaders <-chan election.Leader, after fence.Token) (election.Leader, error) {
	for {
		select {
		case <-ctx.Done():
			return election.Leader{}, fmt.Errorf("waiting for a leader after term %d: %w", after, ctx.Err())
		case l, ok := <-leaders:
			if !ok {
				return election.Leader{}, fmt.Errorf("waiting for a leader after term %d: %w", after, ctx.Err())
			}
			if l.Token > after {
				return l, nil
			}
		}
	}
}

// waitLine waits for a member's line that matches ok.
func (p *parent) waitLine(ctx context.Context, within time.Duration, what string, ok func(string) bool) (event, error) {
	timeout := time.After(within)
	for {
		select {
		case ev := <-p.events:
			if ok(ev.line) {
				return ev, nil
			}
		case <-timeout:
			return event{}, fmt.Errorf("no %s within %v", what, within)
		case <-ctx.Done():
			return event{}, ctx.Err()
		}
	}
}

// pauseLeader stops the leader with SIGSTOP until another member leads and
// has written, resumes it, and reports what its late heartbeat did.
func (p *parent) pauseLeader(ctx context.Context, e *election.Election, leaders <-chan election.Leader, pool *pgxpool.Pool) error {
	time.Sleep(3 * p.cfg.member.Beat)
	old, err := p.writingLeader(ctx, e)
	if err != nil {
		return err
	}
	pr := p.procs[old.Value]
	if pr == nil {
		return fmt.Errorf("the leader %q is not a member of this run", old.Value)
	}
	p.say("stopping %s (leader, term %d) with SIGSTOP for %v\n", old.Value, old.Token, p.cfg.pause)
	stopped := time.Now()
	if err := pr.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	p.stopped = old.Value
	nl, err := nextLeader(ctx, leaders, old.Token)
	if err != nil {
		return err
	}
	p.say("%s elected (term %d) %v after the stop\n", nl.Value, nl.Token, time.Since(stopped).Round(time.Millisecond))
	if _, _, err := p.waitBeatAfter(ctx, old.Token); err != nil {
		return err
	}
	time.Sleep(time.Until(stopped.Add(p.cfg.pause)))
	p.say("resuming %s (SIGCONT)\n", old.Value)
	if err := pr.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		return err
	}
	p.stopped = ""
	resumed, err := p.waitLine(ctx, 30*time.Second, "report of the resumed member", func(l string) bool {
		return len(l) > len(old.Value) && l[:len(old.Value)+1] == old.Value+":" && regexp.MustCompile(`: resumed: `).MatchString(l)
	})
	if err != nil {
		return err
	}
	time.Sleep(3 * p.cfg.member.Beat)
	p.stopAll()
	p.procs = nil
	return p.summary(ctx, pool, resumed.line)
}

// summary reads the heartbeats in the order they were written and reports
// every one that went back to an older term: a deposed leader's overwrite.
func (p *parent) summary(ctx context.Context, pool *pgxpool.Pool, resumed string) error {
	rows, err := pool.Query(ctx, `SELECT member, token FROM leader_beats WHERE election = $1 ORDER BY id`, p.cfg.member.Election)
	if err != nil {
		return err
	}
	defer rows.Close()
	var beats, back int
	terms := map[int64]bool{}
	var prevMember string
	var prev int64
	for rows.Next() {
		var member string
		var token int64
		if err := rows.Scan(&member, &token); err != nil {
			return err
		}
		beats++
		terms[token] = true
		if token < prev {
			back++
			p.say("overwrite: %s, deposed (term %d), wrote the heartbeat after %s (term %d) had\n", member, token, prevMember, prev)
		}
		prev, prevMember = token, member
	}
	if err := rows.Err(); err != nil {
		return err
	}
	var member string
	var token int64
	if err := pool.QueryRow(ctx, `SELECT member, token FROM leader_heartbeat WHERE election = $1`, p.cfg.member.Election).Scan(&member, &token); err != nil {
		return err
	}
	p.say("%d heartbeats by %d terms; the row was last written by %s (term %d)\n", beats, len(terms), member, token)
	switch {
	case back == 0:
		p.say("tokens never went back: no deposed leader's write was stored\n")
	default:
		p.say("the heartbeat went back to an older term %d time(s): a deposed leader overwrote the new leader's row\n", back)
	}
	_ = resumed
	return nil
}

// failovers kills the leader process (SIGKILL) cfg.failover times and
// measures each time from the kill to the new leader's first heartbeat.
func (p *parent) failovers(ctx context.Context, e *election.Election) error {
	var took []time.Duration
	for i := range p.cfg.failover {
		l, err := p.writingLeader(ctx, e)
		if err != nil {
			return err
		}
		// Kill at a varying point of the renewal cycle.
		time.Sleep(p.cfg.member.Beat + time.Duration(i*7919%100)*p.cfg.member.TTL/300)
		pr := p.procs[l.Value]
		if pr == nil {
			return fmt.Errorf("the leader %q is not a member of this run", l.Value)
		}
		killed := time.Now()
		if err := pr.cmd.Process.Kill(); err != nil {
			return err
		}
		t, ev, err := p.waitBeatAfter(ctx, l.Token)
		if err != nil {
			return err
		}
		d := ev.at.Sub(killed)
		took = append(took, d)
		p.beatMu.Lock()
		el := p.elected[t].Sub(killed)
		p.beatMu.Unlock()
		p.say("failover %d: killed %s (term %d); %s (term %d) elected %v and wrote %v later\n", i+1, l.Value, l.Token, ev.line, t, el.Round(time.Millisecond), d.Round(time.Millisecond))
		<-pr.done
		delete(p.procs, l.Value)
		if err := p.start(); err != nil {
			return err
		}
	}
	slices.Sort(took)
	at := func(q float64) time.Duration {
		return took[min(int(q*float64(len(took))+0.999999)-1, len(took)-1)].Round(time.Millisecond)
	}
	p.say("failover from kill -9 of the leader to the new leader's first heartbeat, %d runs, TTL %v: p50 %v, p99 %v, max %v\n",
		len(took), p.cfg.member.TTL, at(0.50), at(0.99), took[len(took)-1].Round(time.Millisecond))
	p.say("for comparison: client-go's leaderelection defaults (LeaseDuration 15s, RetryPeriod 2s) take 15-17s; an etcd session's default TTL is 60s\n")
	return nil
}
