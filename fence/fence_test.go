package fence

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestAdmits(t *testing.T) {
	mark := Fence{Resource: "r", Token: 5, Holder: "a"}
	tests := []struct {
		name string
		hwm  Fence
		f    Fence
		want bool
	}{
		{"no mark admits first grant", Fence{}, Fence{Resource: "r", Token: 1, Holder: "x"}, true},
		{"lower token is stale", mark, Fence{Resource: "r", Token: 4, Holder: "a"}, false},
		{"equal token same holder", mark, Fence{Resource: "r", Token: 5, Holder: "a"}, true},
		{"equal token other holder", mark, Fence{Resource: "r", Token: 5, Holder: "b"}, false},
		{"higher token", mark, Fence{Resource: "r", Token: 6, Holder: "b"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Admits(tt.hwm, tt.f); got != tt.want {
				t.Fatalf("Admits(%v, %v) = %v, want %v", tt.hwm, tt.f, got, tt.want)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		f  Fence
		ok bool
	}{
		{Fence{Resource: "r", Token: 1, Holder: "h"}, true},
		{Fence{Resource: "", Token: 1, Holder: "h"}, false},
		{Fence{Resource: "r", Token: 0, Holder: "h"}, false},
		{Fence{Resource: "r", Token: -3, Holder: "h"}, false},
		{Fence{Resource: "r", Token: 1, Holder: ""}, false},
		{Fence{Resource: strings.Repeat("r", MaxResourceLen), Token: 1, Holder: "h"}, true},
		{Fence{Resource: strings.Repeat("r", MaxResourceLen+1), Token: 1, Holder: "h"}, false},
		{Fence{Resource: "r\x00s", Token: 1, Holder: "h"}, false},
		{Fence{Resource: "r\xffs", Token: 1, Holder: "h"}, false},
		{Fence{Resource: "r", Token: 1, Holder: "h\x00"}, false},
		{Fence{Resource: "r", Token: 1, Holder: "\xc3"}, false},
		{Fence{Resource: "ünïcode", Token: 1, Holder: "h"}, true},
	}
	for _, tt := range tests {
		err := tt.f.Validate()
		if (err == nil) != tt.ok {
			t.Errorf("Validate(%v) = %v, want ok=%v", tt.f, err, tt.ok)
		}
		if err != nil && !errors.Is(err, errInvalidFence) {
			t.Errorf("Validate(%v) = %v, does not match ErrInvalid", tt.f, err)
		}
	}
}

func TestStaleError(t *testing.T) {
	hwm := Fence{Resource: "r", Token: 9, Holder: "b"}
	err := fmt.Errorf("write: %w", &StaleError{Fence: Fence{Resource: "r", Token: 3, Holder: "a"}, HighWater: hwm})
	if !errors.Is(err, ErrStale) {
		t.Fatal("wrapped StaleError does not match ErrStale")
	}
	if errors.Is(err, ErrConflict) {
		t.Fatal("StaleError matches ErrConflict")
	}
	got, ok := LostTo(err)
	if !ok || got != hwm {
		t.Fatalf("HighWater = %v, %v; want %v, true", got, ok, hwm)
	}
	if _, ok := LostTo(errors.New("other")); ok {
		t.Fatal("HighWater found a mark in an unrelated error")
	}
}

func TestConflictError(t *testing.T) {
	err := fmt.Errorf("save: %w", &ConflictError{Key: "k", Expected: 2, Actual: 3})
	if !errors.Is(err, ErrConflict) || errors.Is(err, ErrStale) {
		t.Fatalf("ConflictError matching is wrong: %v", err)
	}
	if got := (&ConflictError{Key: "k", Expected: 2, Actual: -1}).Error(); got == "" {
		t.Fatal("empty message")
	}
}

func TestNewHolder(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		h := NewHolder()
		if len(h) != 32 {
			t.Fatalf("holder %q is not 32 hex digits", h)
		}
		if seen[h] {
			t.Fatalf("holder %q repeated", h)
		}
		seen[h] = true
	}
}

func TestOutcomeUnknownMatchesSentinelAndCause(t *testing.T) {
	cause := errors.New("connection reset")
	err := fmt.Errorf("wrapped: %w", &OutcomeUnknownError{Op: "store: Set", Err: cause})
	if !errors.Is(err, ErrOutcomeUnknown) || !errors.Is(err, cause) {
		t.Fatalf("%v: want a match for ErrOutcomeUnknown and the cause", err)
	}
	if !strings.Contains(err.Error(), "store: Set") || !strings.Contains(err.Error(), "connection reset") {
		t.Fatalf("%q: want the call and the cause named", err)
	}
}

func TestInvalidFenceIsInvalid(t *testing.T) {
	err := Fence{}.Validate()
	if !errors.Is(err, errInvalidFence) || !errors.Is(err, ErrInvalid) {
		t.Fatalf("%v: want a match for ErrInvalid", err)
	}
}

// TestZeroFenceSaysWhy: the zero Fence is what a caller holds after ignoring
// the error of the call that should have made it, so its error says that,
// while a fence with only some fields missing keeps naming the field.
func TestZeroFenceSaysWhy(t *testing.T) {
	err := Fence{}.Validate()
	const want = "zero Fence: was an error from Acquire or FenceLock ignored?"
	if err == nil || !strings.HasSuffix(err.Error(), want) {
		t.Fatalf("Fence{}.Validate() = %v, want it to end %q", err, want)
	}
	if !errors.Is(err, errInvalidFence) || !errors.Is(err, ErrInvalid) {
		t.Fatalf("%v: want a match for ErrInvalid", err)
	}
	if err := (Fence{Token: 3, Holder: "h"}).Validate(); err == nil || strings.Contains(err.Error(), "zero Fence") || !strings.Contains(err.Error(), "empty resource") {
		t.Fatalf("Validate of a fence with no resource = %v, want it to name the empty resource", err)
	}
}

func TestErrorsNameNoHolder(t *testing.T) {
	secret := NewHolder()
	f := Fence{Resource: "r", Token: 3, Holder: secret}
	for _, s := range []string{
		f.String(),
		(&StaleError{Fence: f, HighWater: Fence{Resource: "r", Token: 4, Holder: secret}}).Error(),
	} {
		if strings.Contains(s, secret) {
			t.Fatalf("%q names the holder id", s)
		}
		if !strings.Contains(s, HolderMark(secret)) {
			t.Fatalf("%q does not carry the holder's mark %s", s, HolderMark(secret))
		}
	}
	if HolderMark(secret) == HolderMark(NewHolder()) {
		t.Fatal("two holders share a mark")
	}
}
