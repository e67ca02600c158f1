package pgsql

import (
	"context"

	"go.opentelemetry.io/otel/trace"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/sqlguard"
)

// store describes this package to the code it shares with storage/postgres
// and storage/mysql: telemetry, the checks made before anything is sent,
// GuardAll's order, the transaction and its commit, Retry and the rules on a
// Table's columns.
var store = &sqlguard.Store{Name: "pgsql", Invalid: invalid, Retryable: ErrRetryable, CommitWatchesContext: pgxStdlib}

// startSpan begins the span of one call; f is nil for calls without a
// fence. A nil ctx is left to the call's own check.
func startSpan(ctx context.Context, name string, f *fence.Fence) (context.Context, trace.Span) {
	return store.StartSpan(ctx, name, f)
}

// endSpan counts a refusal and ends the span with the call's outcome.
func endSpan(ctx context.Context, span trace.Span, err error) {
	store.EndSpan(ctx, span, err)
}

// checkCall refuses a nil handle or a context that is already done, before
// anything is sent.
func checkCall(ctx context.Context, handle any, name string) error {
	return store.CheckCall(ctx, handle, name)
}

// checkFence refuses an invalid fence, naming the call it was passed to.
func checkFence(call string, f fence.Fence) error {
	return store.CheckFence(call, f, fence.Fence.Validate)
}
