package sqlguard

import (
	"strings"

	"github.com/fencekit/fencekit/fence"
)

// CheckFence validates f with validate (fence.Fence.Validate, or an
// adapter's stricter rule) and names the refused call: the error reads
// "<store>: <call>: invalid fence: ..." and still matches what validate's
// error matches (fence.ErrInvalid). A zero fence
// also says what to do about it.
func (s *Store) CheckFence(call string, f fence.Fence, validate func(fence.Fence) error) error {
	err := validate(f)
	if err == nil {
		return nil
	}
	hint := ""
	if f == (fence.Fence{}) {
		hint = "; check the error of the call that gave you the fence, and pass the fence of a lock you hold"
	}
	return &callError{prefix: s.Name + ": " + call + ": ", suffix: hint, err: err}
}

// callError names the call a refused argument was passed to, without
// repeating the "fence: " that starts the module's own sentinels' text.
type callError struct {
	prefix, suffix string
	err            error
}

func (e *callError) Error() string {
	return e.prefix + strings.TrimPrefix(e.err.Error(), "fence: ") + e.suffix
}

func (e *callError) Unwrap() error { return e.err }
