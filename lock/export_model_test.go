package lock

import "github.com/fencekit/fencekit/lock/internal/redisbackend"

// What the lock model (model_test.go) needs to read the scripts' calls from
// its clients' hooks, and to build its broken variants by sending a script
// with one line changed. Tests only.

// ModelScripts maps the hash of each script the model reads to its name
// ("acquire", "try", "extend", "raise", "release").
func ModelScripts() map[string]string { return redisbackend.ModelScripts() }

// ModelScriptSource returns the source of a script named as by
// ModelScripts, as the Locker sends it by EVAL, or "" for another name.
func ModelScriptSource(name string) string { return redisbackend.ModelScriptSource(name) }
