package redisbackend

import "github.com/fencekit/fencekit/internal/lockbackend"

// A waiter of the subscription hub (subscribe.go) is a waiter of the
// contract's queue: the Redis backend's Join returns it.

func (w *waiter) State() (ready, lost <-chan struct{}, confirmed bool) { return w.state() }

func (w *waiter) Wake() <-chan struct{} { return w.wake }

func (w *waiter) Granted() <-chan lockbackend.HandOver { return w.grant }

func (w *waiter) Placed() <-chan lockbackend.Place { return w.place }

func (w *waiter) Owe(owes bool) { w.owes = owes }

func (w *waiter) Leave(acquired bool) { w.t.c.h.leave(w, acquired) }

var _ lockbackend.Waiter = (*waiter)(nil)
