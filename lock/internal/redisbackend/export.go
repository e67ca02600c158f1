package redisbackend

import "time"

// What package lock's tests need from the backend: the lock model
// (lock/model_test.go) reads the scripts' calls from its clients' hooks and
// builds its broken variants by sending a script with one line changed;
// other tests read the queue's messages and trace Redlock grants. Nothing
// here changes what a Locker does unless a test sets RedlockTrace.

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

// ParsePlaces reads a queue announcement (see queue.go).
func ParsePlaces(payload string) (rem time.Duration, first []string, ok bool) {
	return parsePlaces(payload)
}

// RedlockTrace, when set (by tests, while no Locker runs), hears of every
// Redlock grant and extension: what the nodes replied and the validity
// counted from sent.
var RedlockTrace func(holder, op string, sent time.Time, ttl time.Duration, replies string, valid time.Duration)
