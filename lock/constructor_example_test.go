package lock_test

import (
	"fmt"

	"github.com/fencekit/fencekit/lock"
	"github.com/redis/go-redis/v9"
)

// New makes a Locker on one Redis deployment: a server, a Cluster
// (*redis.ClusterClient), a Ring or a failover client. Its Redis names are
// had through As; on another backend As answers false.
func ExampleNew() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
	defer client.Close()
	locker, err := lock.New(client, lock.WithPrefix("billing:"))
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	var names lock.RedisNames
	if locker.As(&names) {
		fmt.Println(names.LockKey("invoice:42"), names.TokenKey("invoice:42"), names.Quorum())
	}
	// Output: billing:{invoice:42}:lock billing:{invoice:42}:token 1
}

// NewRedlock makes a Locker over independent Redis servers: a lease is
// held while a majority of them hold it, and its token is above every
// token any of them issued before.
func ExampleNewRedlock() {
	var clients []redis.UniversalClient
	for _, addr := range []string{"10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"} {
		c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
		defer c.Close()
		clients = append(clients, c)
	}
	locker, err := lock.NewRedlock(clients)
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	var names lock.RedisNames
	if locker.As(&names) {
		fmt.Println("quorum", names.Quorum())
		if _, err := names.FenceKey("legacy:lock"); err != nil {
			fmt.Println("FenceKey:", err)
		}
	}
	// Output:
	// quorum 2
	// FenceKey: lock: not supported by this lock backend: FenceKey: a Redlock Locker does not fence foreign locks
}
