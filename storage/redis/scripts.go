package redis

import (
	_ "embed"

	goredis "github.com/redis/go-redis/v9"
)

var (
	//go:embed fenced.lua
	fencedSrc string
	//go:embed cas.lua
	casSrc string
	//go:embed load.lua
	loadSrc string

	// fencedScript admits a fenced read, write or delete and performs it.
	fencedScript = goredis.NewScript(fencedSrc)
	// casScript performs a version-checked write or delete.
	casScript = goredis.NewScript(casSrc)
	// loadScript reads a value and its mark without writing.
	loadScript = goredis.NewScript(loadSrc)
)
