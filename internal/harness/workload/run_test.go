package workload

import "testing"

func TestLostIncrements(t *testing.T) {
	tests := []struct {
		name    string
		written []int64
		final   int64
		want    int64
	}{
		{"linear chain", []int64{1, 2, 3, 4}, 4, 0},
		{"chain with an uncertain write that landed", []int64{1, 2, 4}, 4, 0},
		{"two writers read the same state", []int64{1, 2, 2, 3}, 3, 1},
		{"a stale write went back below later ones", []int64{1, 2, 3, 2}, 2, 2},
		{"nothing written", nil, 0, 0},
	}
	for _, tt := range tests {
		if got := lostIncrements(tt.written, tt.final); got != tt.want {
			t.Errorf("%s: lostIncrements(%v, %d) = %d, want %d", tt.name, tt.written, tt.final, got, tt.want)
		}
	}
}

func TestStateRoundTrip(t *testing.T) {
	s := State{N: 42, Last: 7}
	got, err := ParseState([]byte(s.String()))
	if err != nil || got != s {
		t.Fatalf("ParseState(%q) = %v, %v", s.String(), got, err)
	}
	if got, err := ParseState(nil); err != nil || got != (State{}) {
		t.Fatalf("ParseState(nil) = %v, %v", got, err)
	}
	for _, bad := range []string{"x", "1:x", "x:1"} {
		if _, err := ParseState([]byte(bad)); err == nil {
			t.Errorf("ParseState(%q) accepted", bad)
		}
	}
}
