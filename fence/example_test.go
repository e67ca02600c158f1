package fence_test

import (
	"errors"
	"fmt"

	"github.com/fencekit/fencekit/fence"
)

// A store admits a fence if its token is newer than the mark, or if it is
// the mark's own token presented by the mark's own holder.
func ExampleAdmits() {
	mark := fence.Fence{Resource: "invoice:42", Token: 7, Holder: "b"}
	fmt.Println(fence.Admits(mark, fence.Fence{Resource: "invoice:42", Token: 6, Holder: "a"}))
	fmt.Println(fence.Admits(mark, fence.Fence{Resource: "invoice:42", Token: 7, Holder: "b"}))
	fmt.Println(fence.Admits(mark, fence.Fence{Resource: "invoice:42", Token: 7, Holder: "c"}))
	fmt.Println(fence.Admits(mark, fence.Fence{Resource: "invoice:42", Token: 8, Holder: "c"}))
	// Output:
	// false
	// true
	// false
	// true
}

// A refused operation returns an error that matches ErrStale and carries the
// mark it lost to, which a lock can use to heal a counter that Redis lost.
func ExampleLostTo() {
	err := fmt.Errorf("save invoice: %w", &fence.StaleError{
		Fence:     fence.Fence{Resource: "invoice:42", Token: 3, Holder: "a"},
		HighWater: fence.Fence{Resource: "invoice:42", Token: 9, Holder: "b"},
	})
	if errors.Is(err, fence.ErrStale) {
		hwm, _ := fence.LostTo(err)
		fmt.Println("a newer holder was admitted, token", hwm.Token)
	}
	// Output: a newer holder was admitted, token 9
}

// A lock other than this module's can drive the storage guards: build the
// fence from its resource, a strictly increasing token per grant and a
// holder id unique to the grant.
func ExampleFence() {
	f := fence.Fence{Resource: "nightly-report", Token: 12, Holder: fence.NewHolder()}
	fmt.Println(f.Validate() == nil)
	fmt.Println(errors.Is(fence.Fence{Resource: "nightly-report"}.Validate(), fence.ErrInvalid))
	// Output:
	// true
	// true
}
