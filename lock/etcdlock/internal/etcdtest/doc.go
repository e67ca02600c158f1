// Package etcdtest starts real etcd clusters in-process for the tests of
// the etcd lock: members on free loopback ports, each reachable through a
// fault proxy, that a test can stop and restart, with their peer traffic
// through a Partition that can cut a member off from the others. Tests
// that need only a healthy cluster share one (shared_test.go). It is a
// module of its own that nothing but these tests imports, so etcd's server
// never enters the module graph of etcdlock or of fencekit.
package etcdtest
