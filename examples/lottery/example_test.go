package main

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Three instances race for one day's draw; the first to win the lock pauses
// past its lease before drawing, and storage refuses its late draw.
func ExampleDraw() {
	day, _ := time.Parse("2006-01-02", "2030-01-01")
	res, err := Draw(context.Background(), Config{
		PostgresURL: "postgres://postgres@127.0.0.1:5432/test",
		Redis:       redis.Options{Addr: "127.0.0.1:6379"},
		Day:         day,
		Instances:   3,
		Winners:     5,
		TTL:         500 * time.Millisecond,
		Pause:       true,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, in := range res.Instances {
		fmt.Printf("instance %d, token %d: %s\n", in.ID, in.Token, in.Outcome)
	}
	if res.Record != nil {
		fmt.Printf("drawn by token %d: %d winners\n", res.Record.Token, len(res.Winners))
	}
}
