package etcdlock_test

import (
	"context"
	"fmt"
	"log"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencekit/fencekit/lock"
	"github.com/fencekit/fencekit/lock/etcdlock"
)

// A Locker on an etcd cluster: the lease's fence carries an etcd token,
// which the storage guards admit as they do any other. (It needs a
// cluster on localhost:2379; the test module runs the same steps on an
// embedded one.)
func ExampleNew() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"localhost:2379"}, DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	locker, err := etcdlock.New(cli, lock.WithPrefix("billing:"))
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lease, err := locker.Acquire(ctx, "invoice-42", 10*time.Second, lock.AutoRenew())
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(context.Background())
	// Present lease.Fence() to storage with every write made under the lock.
	fmt.Println(lease.Fence().Token > etcdlock.TokenBase)
}
