package pserver

import (
	"sync"
	"sync/atomic"
)

// lifecycle counts calls in flight on a handle so that close waits for
// them, runs the C delete once, and turns later calls into ErrClosed.
type lifecycle struct {
	mu       sync.Mutex
	closed   bool
	inFlight sync.WaitGroup
	count    atomic.Int64 // calls in flight, for tests
}

// begin registers a call; ErrClosed after close. Pair with end.
func (l *lifecycle) begin() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	l.inFlight.Add(1)
	l.count.Add(1)
	return nil
}

func (l *lifecycle) end() {
	l.count.Add(-1)
	l.inFlight.Done()
}

// close marks the handle closed, waits for the calls in flight, then runs
// del; a second close does nothing and returns false.
func (l *lifecycle) close(del func()) bool {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return false
	}
	l.closed = true
	l.mu.Unlock()
	l.inFlight.Wait()
	del()
	return true
}
