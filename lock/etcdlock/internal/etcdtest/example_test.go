package etcdtest

import (
	"context"
	"fmt"
	"log"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencekit/fencekit/lock"
	"github.com/fencekit/fencekit/lock/etcdlock"
)

// etcdlock.New's example, run on the package's embedded cluster: a lease's
// fence carries an etcd token, and the next holder's token is higher.
func Example_etcdlockNew() {
	c, err := startShared()
	if err != nil {
		log.Fatal(err)
	}
	var endpoints []string
	for _, m := range c.Members {
		endpoints = append(endpoints, m.ClientURL())
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	locker, err := etcdlock.New(cli, lock.WithPrefix("example:"))
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	first, err := locker.Acquire(ctx, "invoice-42", 10*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("an etcd token:", first.Fence().Token > etcdlock.TokenBase)
	if err := first.Release(ctx); err != nil {
		log.Fatal(err)
	}
	next, err := locker.Acquire(ctx, "invoice-42", 10*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	defer next.Release(context.Background())
	fmt.Println("higher for the next holder:", next.Fence().Token > first.Fence().Token)
	// Output:
	// an etcd token: true
	// higher for the next holder: true
}
