package pglock_test

import (
	"errors"
	"testing"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/internal/lockbackend"
	"github.com/fencekit/fencekit/lock"
	"github.com/fencekit/fencekit/lock/pglock"
)

func TestNewRefusesBadInput(t *testing.T) {
	if _, err := pglock.New(nil); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("New(nil) = %v, want fence.ErrInvalid", err)
	}
	if lockbackend.Open == nil {
		t.Skip("package lock opens no backends in this build")
	}
	pool := testenv.Postgres(t)
	if _, err := pglock.New(pool, lock.WithPrefix("x:")); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("New with a Redis key prefix = %v, want fence.ErrInvalid", err)
	}
}
