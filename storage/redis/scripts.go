package redis

import (
	_ "embed"

	"github.com/fencekit/fencekit/internal/rediscmd"
)

// Every script runs value.lua's shared functions before its own body: the
// reading of a value hash and the writing of a value live in one place.
var (
	//go:embed value.lua
	valueSrc string
	//go:embed fenced.lua
	fencedSrc string
	//go:embed fenced_fast.lua
	fencedFastSrc string
	//go:embed cas.lua
	casSrc string
	//go:embed load.lua
	loadSrc string

	// fencedScript admits a fenced read, write or delete and performs it.
	// A read or write under the key's mark is done before value.lua's
	// helpers are made.
	fencedScript = rediscmd.NewScript(fencedFastSrc + valueSrc + fencedSrc)
	// casScript performs a version-checked write or delete.
	casScript = rediscmd.NewScript(valueSrc + casSrc)
	// loadScript reads a value and its mark without writing.
	loadScript = rediscmd.NewScript(valueSrc + loadSrc)
)
