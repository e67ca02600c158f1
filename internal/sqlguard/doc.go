// Package sqlguard holds what the SQL storage adapters (storage/postgres and
// storage/mysql) do alike whatever their driver: their telemetry, the checks
// made before anything is sent, the order in which several fences are
// guarded, the retry loop, and the rules that keep a fenced table's columns
// apart. It imports no database driver; each adapter keeps its SQL, its
// driver's types and how its server's errors are read.
//
// An adapter describes itself once with a [Store]; error messages carry its
// name, as if the adapter had written them.
package sqlguard
