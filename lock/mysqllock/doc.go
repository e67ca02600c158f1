// Package mysqllock puts the lock of package lock on MySQL or MariaDB
// alone: a [lock.Locker] whose leases and fencing tokens live in the
// database whose storage guard (storage/mysql) admits them.
package mysqllock
