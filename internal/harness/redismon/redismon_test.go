package redismon

import (
	"fmt"
	"testing"
)

func TestParseLine(t *testing.T) {
	c, ok := ParseLine(`+1795777344.298065 [0 lua] "HSET" "r" "v" "a \"b\"\\\x41" "t" "5"`)
	if !ok || !c.Lua || fmt.Sprint(c.Args) != `[HSET r v a "b"\A t 5]` || c.At.UnixMicro() != 1795777344298065 {
		t.Fatalf("parsed %+v, %v", c, ok)
	}
	c, ok = ParseLine(`+1795777344.298004 [0 127.0.0.1:42004] "set" "k" "v"`)
	if !ok || c.Lua || c.Args[0] != "SET" {
		t.Fatalf("parsed %+v, %v", c, ok)
	}
}
