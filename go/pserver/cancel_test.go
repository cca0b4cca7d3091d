package pserver_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/pserver-project/pserver/go/pserver"
)

// startSignal is a ctx that tells when a call has begun: the library call
// asks for its deadline (to pass it down) right before it starts.
type startSignal struct {
	context.Context
	once    sync.Once
	started chan struct{}
}

func (c *startSignal) Deadline() (time.Time, bool) {
	c.once.Do(func() { close(c.started) })
	return c.Context.Deadline()
}

// A ctx cancelled while a Barrier waits for a member who never comes ends
// the library call itself: Barrier returns promptly, and Close (which waits
// for calls in flight) has nothing left to wait for.
func TestContextCancelEndsTheLibraryCall(t *testing.T) {
	cluster, err := pserver.NewLocalCluster(2, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	client, err := pserver.NewClient(context.Background(), pserver.Options{Servers: cluster.Addresses(), Timeout: 60 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	group, err := client.Group("g", 2, "alone")
	if err != nil {
		t.Fatal(err)
	}
	base, cancel := context.WithCancel(context.Background())
	ctx := &startSignal{Context: base, started: make(chan struct{})}
	start := time.Now()
	errs := make(chan error, 1)
	go func() { errs <- group.Barrier(ctx, pserver.BarrierWorkers) }()
	select {
	case <-ctx.started: // the library call is starting: cancel it in flight
	case <-time.After(30 * time.Second):
		t.Fatal("Barrier never started its library call")
	}
	cancel()
	select {
	case err := <-errs:
		if !errors.Is(err, pserver.ErrCanceled) || !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled Barrier: %v", err)
		}
	case <-time.After(30 * time.Second): // the call would wait 60 s
		t.Fatal("Barrier did not return after its ctx was cancelled")
	}
	// Nothing is left running: Close does not wait for a library call.
	closed := make(chan struct{})
	go func() { client.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("Close waited for a call left running")
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("took %v", d)
	}
}

// Names travel with their length: one with a NUL byte is refused, never
// cut short and stored under "a".
func TestNameWithNulIsRefused(t *testing.T) {
	_, client := newCluster(t, 2, nil)
	ctx := context.Background()
	err := client.Init(ctx, "a\x00b", pserver.Vector[float32](1, 2), nil)
	if !errors.Is(err, pserver.ErrInvalidArgument) {
		t.Fatalf("Init(\"a\\x00b\"): %v", err)
	}
	if err := client.FinishInit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Get(ctx, "a"); !errors.Is(err, pserver.ErrNotFound) {
		t.Fatalf("Get(\"a\") after the refused init: %v", err)
	}
	if _, err := client.CreateTable(ctx, "t\x00", pserver.TableConfig{Dim: 2}); !errors.Is(err, pserver.ErrInvalidArgument) {
		t.Fatalf("CreateTable(\"t\\x00\"): %v", err)
	}
	if err := client.Init(ctx, "\xff", pserver.Vector[float32](1), nil); !errors.Is(err, pserver.ErrInvalidArgument) {
		t.Fatalf("Init(\"\\xff\"): %v", err)
	}
}
