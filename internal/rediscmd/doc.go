// Package rediscmd is the small command interface that fencekit's Redis
// code runs on, so that one set of scripts serves every Redis client
// library: go-redis (in this module) and rueidis (the nested module
// lock/rueidisfence). The lock's Redis backend builds its full client on
// [Runner]; storage/redis needs only [Runner] and, to preload its scripts,
// [Loader].
//
// rediscmd.go holds the interface, its reply and the script helper;
// store.go what storage/redis adds for its own constructor (the hook that
// lets a nested module build a Store on another client).
package rediscmd
