// Package etcdtest starts real etcd clusters in-process for the tests of
// the etcd lock: members on free loopback ports, each reachable through a
// fault proxy, that a test can stop and restart. It is a module of its own
// that nothing but these tests imports, so etcd's server never enters the
// module graph of etcdlock or of fencekit.
package etcdtest
