package sqlguard

import (
	"slices"
	"strings"

	"github.com/fencekit/fencekit/fence"
)

// SortFences returns a copy of fences in the order GuardAll locks their
// guard rows: ascending byte order of resource name (strings.Compare, which
// is also how MySQL orders its VARBINARY guard key), one order for every
// caller, so that two transactions guarding overlapping sets never deadlock
// on guard rows. It refuses, before anything
// is sent, an empty list, a fence that validate refuses and a resource named
// twice.
func (s *Store) SortFences(fences []fence.Fence, validate func(fence.Fence) error) ([]fence.Fence, error) {
	if len(fences) == 0 {
		return nil, s.Invalid("no fences to guard")
	}
	sorted := slices.Clone(fences)
	for _, f := range sorted {
		if err := validate(f); err != nil {
			return nil, err
		}
	}
	slices.SortFunc(sorted, func(a, b fence.Fence) int { return strings.Compare(a.Resource, b.Resource) })
	for i := 1; i < len(sorted); i++ {
		if sorted[i].Resource == sorted[i-1].Resource {
			return nil, s.Invalid("resource %q appears more than once", sorted[i].Resource)
		}
	}
	return sorted, nil
}
