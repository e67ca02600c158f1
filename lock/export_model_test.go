package lock

// What the lock model (model_test.go) needs to read the scripts' calls from
// its clients' hooks, and to build its broken variants by sending a script
// with one line changed. Tests only.

// ModelScripts maps the hash of each script the model reads to its name
// ("acquire", "try", "extend", "raise", "release"), so that a hook names a
// call by what it runs rather than by how many arguments it has.
func ModelScripts() map[string]string {
	return map[string]string{
		acquireScript.Hash():      "acquire",
		tryScript.Hash():          "try",
		extendScript.Hash():       "extend",
		redlockRaiseScript.Hash(): "raise",
		releaseScript.Hash():      "release",
	}
}

// ModelScriptSource returns the source of a script named as by
// ModelScripts, as the Locker sends it by EVAL, or "" for another name.
func ModelScriptSource(name string) string {
	switch name {
	case "acquire":
		return tokenStateLua + handOverLua + acquireLua
	case "try":
		return trySrc
	case "raise":
		return tokenStateLua + redlockRaiseLua
	case "release":
		return releaseSrc
	}
	return ""
}
