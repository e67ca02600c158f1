package main

import (
	"bufio"
	"strconv"
	"strings"
	"testing"

	"github.com/fencekit/fencekit/internal/harness/testenv"
)

// lostByMode reads the "lost updates" column of each storage's table.
func lostByMode(t *testing.T, out string) map[string]int {
	t.Helper()
	lost := map[string]int{}
	storage := ""
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if s, ok := strings.CutPrefix(line, "Storage: "); ok {
			storage = s
			continue
		}
		for _, mode := range []string{"plain lock", "fenced"} {
			if rest, ok := strings.CutPrefix(line, mode+" "); ok {
				f := strings.Fields(rest)
				n, err := strconv.Atoi(f[len(f)-1])
				if err != nil {
					t.Fatalf("bad table row %q", line)
				}
				lost[storage+"/"+mode] = n
			}
		}
	}
	return lost
}

func runDemo(t *testing.T, args ...string) (string, int) {
	t.Helper()
	var out, errs strings.Builder
	code := run(append([]string{"-duration", "1s"}, args...), &out, &errs)
	t.Log(out.String())
	if errs.Len() > 0 {
		t.Log(errs.String())
	}
	return out.String(), code
}

func TestDemoNeedsNoServers(t *testing.T) {
	t.Parallel()
	out, code := runDemo(t)
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	lost := lostByMode(t, out)
	if lost["redis/plain lock"] == 0 {
		t.Fatal("the plain lock lost nothing: the demo does not show the problem")
	}
	if n, ok := lost["redis/fenced"]; !ok || n != 0 {
		t.Fatalf("fenced mode: lost=%d (row found: %v)", n, ok)
	}
	if !strings.Contains(out, "One lost update as it happened") {
		t.Fatal("no timeline of a lost update")
	}
}

func TestDemoOnRealServers(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	redisURL := testenv.RedisURL(t)
	addr := strings.TrimSuffix(strings.TrimPrefix(redisURL, "redis://"), "/0")
	out, code := runDemo(t, "-redis", addr, "-postgres", testenv.PostgresURL(t))
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	// Each storage's story shows the pause past the lease and the moment the
	// lease ran out, which is what lets the next holder in.
	if n := strings.Count(out, "One lost update as it happened"); n != 2 {
		t.Errorf("%d lost-update stories, want one per storage", n)
	}
	if n := strings.Count(out, "lease has run out"); n < 2 {
		t.Errorf("%d lease-expiry steps in the stories, want at least one per storage", n)
	}
	lost := lostByMode(t, out)
	for _, s := range []string{"redis", "postgres"} {
		if lost[s+"/plain lock"] == 0 {
			t.Errorf("%s: the plain lock lost nothing", s)
		}
		if n, ok := lost[s+"/fenced"]; !ok || n != 0 {
			t.Errorf("%s fenced: lost=%d (row found: %v)", s, n, ok)
		}
	}
}

func TestDemoBadFlagsAndUnreachableServers(t *testing.T) {
	for _, args := range [][]string{{"-no-such-flag"}, {"-workers", "0"}, {"-ttl", "0s"}, {"-duration", "-1s"}} {
		if _, code := runDemo(t, args...); code != 2 {
			t.Fatalf("%v: exit %d, want 2", args, code)
		}
	}
	var out, errs strings.Builder
	if code := run([]string{"-redis", "127.0.0.1:1"}, &out, &errs); code != 2 || !strings.HasPrefix(errs.String(), "lostupdate: cannot reach Redis at 127.0.0.1:1") {
		t.Fatalf("unreachable Redis: exit %d, stderr %q; want 2 and our message", code, errs.String())
	}
}
