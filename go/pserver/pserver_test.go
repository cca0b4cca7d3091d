package pserver_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pserver-project/pserver/go/pserver"
)

func mustTensor[T pserver.Element](t *testing.T, v []T, shape ...int64) *pserver.Tensor {
	t.Helper()
	x, err := pserver.NewTensor(v, shape...)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func newCluster(t *testing.T, n int, opts *pserver.ServerOptions) (*pserver.LocalCluster, *pserver.Client) {
	t.Helper()
	cluster, err := pserver.NewLocalCluster(n, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cluster.Close() })
	client, err := pserver.NewClient(context.Background(), pserver.Options{Servers: cluster.Addresses(), Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return cluster, client
}

func TestVersion(t *testing.T) {
	if v := pserver.Version(); v != "0.7.0" {
		t.Fatalf("version %q, want 0.7.0", v)
	}
}

func TestHappyPath(t *testing.T) {
	ctx := context.Background()
	_, client := newCluster(t, 2, nil)
	if n := client.NumServers(); n != 2 {
		t.Fatalf("NumServers = %d", n)
	}
	if err := client.Init(ctx, "w", mustTensor(t, []float32{1, 2, 3, 4, 5, 6}, 2, 3),
		&pserver.ParamConfig{Optimizer: "sgd", Settings: map[string]float64{"learning_rate": 0.5}}); err != nil {
		t.Fatal(err)
	}
	if err := client.Init(ctx, "d", mustTensor(t, []float64{1, 2}), nil); err != nil {
		t.Fatal(err)
	}
	if err := client.Init(ctx, "c", mustTensor(t, []int64{10, 20, 30}), &pserver.ParamConfig{Optimizer: "add"}); err != nil {
		t.Fatal(err)
	}
	if err := client.Init(ctx, "u", mustTensor(t, []uint32{7}), &pserver.ParamConfig{Optimizer: "add"}); err != nil {
		t.Fatal(err)
	}
	if err := client.FinishInit(ctx); err != nil {
		t.Fatal(err)
	}
	dtype, shape, err := client.Info(ctx, "w")
	if err != nil || dtype != pserver.Float32 || !reflect.DeepEqual(shape, []int64{2, 3}) {
		t.Fatalf("Info = %v %v %v", dtype, shape, err)
	}
	if err := client.SendGrad(ctx, "w", mustTensor(t, []float32{2, 2, 2, 2, 2, 2}, 2, 3)); err != nil {
		t.Fatal(err)
	}
	w, err := client.Get(ctx, "w")
	if err != nil {
		t.Fatal(err)
	}
	got, err := pserver.Values[float32](w)
	if err != nil || !reflect.DeepEqual(got, []float32{0, 1, 2, 3, 4, 5}) || !reflect.DeepEqual(w.Shape(), []int64{2, 3}) {
		t.Fatalf("w = %v %v", w, err)
	}
	if err := client.SendGrads(ctx, map[string]*pserver.Tensor{
		"c": mustTensor(t, []int64{1, 1, 1}),
		"u": mustTensor(t, []uint32{3}),
	}); err != nil {
		t.Fatal(err)
	}
	many, err := client.GetMany(ctx, []string{"c", "u", "d"})
	if err != nil {
		t.Fatal(err)
	}
	if c, _ := pserver.Values[int64](many["c"]); !reflect.DeepEqual(c, []int64{11, 21, 31}) {
		t.Fatalf("c = %v", many["c"])
	}
	if u, _ := pserver.Values[uint32](many["u"]); !reflect.DeepEqual(u, []uint32{10}) {
		t.Fatalf("u = %v", many["u"])
	}
	out, err := client.PushPull(ctx, map[string]*pserver.Tensor{"d": mustTensor(t, []float64{100, 100})})
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := pserver.Values[float64](out["d"]); math.Abs(d[0]-0) > 1e-9 || math.Abs(d[1]-1) > 1e-9 {
		t.Fatalf("d = %v", out["d"])
	}
	stats, err := client.Stats(ctx)
	if err != nil || len(stats) != 2 || !stats[0].Initialized || stats[1].Index != 1 {
		t.Fatalf("Stats = %+v %v", stats, err)
	}
	// The live servers' parameters, each once, in name order.
	params, err := client.ListParams(ctx)
	if err != nil || len(params) != 4 {
		t.Fatalf("ListParams = %+v %v", params, err)
	}
	want := pserver.ParamListing{Name: "w", DType: pserver.Float32, Shape: []int64{2, 3}, Optimizer: "sgd"}
	listedW := params[3]
	if params[0].Name != "c" || params[1].Name != "d" || params[2].Name != "u" || params[0].Optimizer != "add" ||
		params[2].DType != pserver.Uint32 || listedW.BlocksHeld != listedW.BlockCount || listedW.BlockCount < 1 {
		t.Fatalf("ListParams = %+v", params)
	}
	listedW.BlocksHeld, listedW.BlockCount = 0, 0
	if !reflect.DeepEqual(listedW, want) {
		t.Fatalf("ListParams w = %+v, want %+v", listedW, want)
	}
}

func TestInProcessClientAndServer(t *testing.T) {
	ctx := context.Background()
	cluster, err := pserver.NewLocalCluster(1, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	client, err := cluster.Client(ctx, pserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	if err := client.Init(ctx, "x", pserver.Scalar(int32(5)), &pserver.ParamConfig{Optimizer: "add"}); err != nil {
		t.Fatal(err)
	}
	if err := client.FinishInit(ctx); err != nil {
		t.Fatal(err)
	}
	x, err := client.Get(ctx, "x")
	if v, _ := pserver.Values[int32](x); err != nil || len(x.Shape()) != 0 || v[0] != 5 {
		t.Fatalf("x = %v %v", x, err)
	}

	server, err := pserver.NewServer(&pserver.ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if server.Port() == 0 || server.Address() == "" {
		t.Fatalf("server at %q", server.Address())
	}
	sc, err := server.Client(ctx, pserver.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	if err := sc.Init(ctx, "y", mustTensor(t, []uint64{1, 2}), nil); err != nil {
		t.Fatal(err)
	}
	if err := server.SaveCheckpoint(ctx); !errors.Is(err, pserver.ErrFailedPrecondition) {
		t.Fatalf("SaveCheckpoint without a directory: %v", err)
	}
	server.Stop(0)
	server.Close()
	server.Close()
	if err := server.SaveCheckpoint(ctx); !errors.Is(err, pserver.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

func TestServerAdvertiseHost(t *testing.T) {
	if _, err := pserver.NewServer(&pserver.ServerOptions{Host: "0.0.0.0"}); !errors.Is(err, pserver.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "advertise_host") {
		t.Fatalf("0.0.0.0 without AdvertiseHost: %v", err)
	}
	server, err := pserver.NewServer(&pserver.ServerOptions{Host: "0.0.0.0", AdvertiseHost: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	if want := fmt.Sprintf("127.0.0.1:%d", server.Port()); server.Address() != want {
		t.Fatalf("address %q, want %q", server.Address(), want)
	}
}

func TestErrorCodes(t *testing.T) {
	ctx := context.Background()
	_, client := newCluster(t, 1, nil)
	w := mustTensor(t, []float32{1, 2})
	if err := client.Init(ctx, "w", w, nil); err != nil {
		t.Fatal(err)
	}
	// Reads before FinishInit.
	_, err := client.Get(ctx, "w")
	if !errors.Is(err, pserver.ErrUninitialized) {
		t.Fatalf("Get before FinishInit: %v", err)
	}
	err = client.Init(ctx, "w", w, nil)
	if !errors.Is(err, pserver.ErrAlreadyInitialized) {
		t.Fatalf("second Init: %v", err)
	}
	var perr *pserver.Error
	if !errors.As(err, &perr) || perr.Code != pserver.AlreadyExists || perr.Msg == "" {
		t.Fatalf("errors.As: %#v", perr)
	}
	if errors.Is(err, pserver.ErrNotFound) || errors.Is(err, pserver.ErrClosed) {
		t.Fatal("ALREADY_EXISTS matches other sentinels")
	}
	if err := client.Init(ctx, "bad", w, &pserver.ParamConfig{Optimizer: "nope"}); !errors.Is(err, pserver.ErrInvalidArgument) {
		t.Fatalf("bad optimizer: %v", err)
	}
	if err := client.FinishInit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Get(ctx, "missing"); !errors.Is(err, pserver.ErrNotFound) {
		t.Fatalf("Get missing: %v", err)
	}
	// Wrong element type: the library refuses, naming what it expected.
	if err := client.SendGrad(ctx, "w", mustTensor(t, []float64{1, 2})); !errors.Is(err, pserver.ErrInvalidArgument) {
		t.Fatalf("float64 grad for float32: %v", err)
	}
	if err := client.GetInto(ctx, "w", mustTensor(t, []int32{0, 0})); !errors.Is(err, pserver.ErrInvalidArgument) {
		t.Fatalf("int32 out for float32: %v", err)
	}
	if err := client.SendGrad(ctx, "w", mustTensor(t, []float32{1, 2, 3})); !errors.Is(err, pserver.ErrInvalidArgument) {
		t.Fatalf("wrong size grad: %v", err)
	}
	got, _ := client.Get(ctx, "w")
	if _, err := pserver.Values[float64](got); !errors.Is(err, pserver.ErrInvalidArgument) {
		t.Fatalf("Values of the wrong type: %v", err)
	}
	if _, err := pserver.NewTensor([]float32{1, 2, 3}, 2, 2); !errors.Is(err, pserver.ErrInvalidArgument) {
		t.Fatalf("bad shape: %v", err)
	}
	if _, err := pserver.NewClient(ctx, pserver.Options{}); !errors.Is(err, pserver.ErrInvalidArgument) {
		t.Fatalf("no servers: %v", err)
	}
	if _, err := pserver.NewLocalCluster(0, nil); !errors.Is(err, pserver.ErrInvalidArgument) {
		t.Fatalf("0 servers: %v", err)
	}
}

func TestCloseSemantics(t *testing.T) {
	ctx := context.Background()
	_, client := newCluster(t, 1, nil)
	if err := client.Init(ctx, "w", mustTensor(t, make([]float32, 1<<16)), nil); err != nil {
		t.Fatal(err)
	}
	if err := client.FinishInit(ctx); err != nil {
		t.Fatal(err)
	}
	// Calls in flight while Close runs: each either completes or gets
	// ErrClosed, and Close returns only after all of them have left C.
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	start := make(chan struct{})
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for j := 0; j < 20; j++ {
				if _, err := client.Get(ctx, "w"); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	close(start)
	time.Sleep(5 * time.Millisecond)
	if err := client.Close(); err != nil {
		t.Fatal(err)
	}
	if err := client.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, pserver.ErrClosed) {
			t.Fatalf("in flight during Close: %v", err)
		}
	}
	if _, err := client.Get(ctx, "w"); !errors.Is(err, pserver.ErrClosed) {
		t.Fatalf("Get after Close: %v", err)
	}
	if err := client.FinishInit(ctx); !errors.Is(err, pserver.ErrClosed) || !errors.Is(err, pserver.ErrFailedPrecondition) {
		t.Fatalf("FinishInit after Close: %v", err)
	}
	if client.NumServers() != 0 {
		t.Fatal("NumServers after Close")
	}
}

func TestCloseWaitsForInFlight(t *testing.T) {
	// A server that accepts connections and never answers: the call blocks
	// until the client's 1 s timeout, and Close must wait for it.
	ctx := context.Background()
	ln := hangingListener(t)
	client, err := pserver.NewClient(ctx, pserver.Options{Servers: []string{ln}, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- client.FinishInit(ctx) }()
	for deadline := time.Now().Add(5 * time.Second); pserver.InFlight(client) == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the call never started")
		}
	}
	client.Close()
	// Close returned only once the call had left the library...
	if n := pserver.InFlight(client); n != 0 {
		t.Fatalf("%d calls still in flight after Close", n)
	}
	// ...and the call ran to its own end (the 1 s timeout), not ErrClosed.
	select {
	case err := <-done:
		if err == nil || errors.Is(err, pserver.ErrClosed) {
			t.Fatalf("FinishInit against a silent server: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("FinishInit did not return")
	}
}

func TestContextDeadline(t *testing.T) {
	ln := hangingListener(t)
	client, err := pserver.NewClient(context.Background(), pserver.Options{Servers: []string{ln}, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = client.Get(ctx, "w")
	if !errors.Is(err, pserver.ErrDeadlineExceeded) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Get with a 100 ms deadline: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("deadline ignored: %v", d)
	}
	// An already-expired ctx fails at once; a cancelled one is CANCELLED.
	if err := client.FinishInit(ctx); !errors.Is(err, pserver.ErrDeadlineExceeded) {
		t.Fatalf("expired ctx: %v", err)
	}
	cctx, ccancel := context.WithCancel(context.Background())
	ccancel()
	if err := client.FinishInit(cctx); !errors.Is(err, pserver.ErrCanceled) || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled ctx: %v", err)
	}
	// The library's own timeout (no ctx deadline) is DEADLINE_EXCEEDED or
	// UNAVAILABLE too.
	fast, err := pserver.NewClient(context.Background(), pserver.Options{Servers: []string{ln}, Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer fast.Close()
	if err := fast.FinishInit(context.Background()); !errors.Is(err, pserver.ErrDeadlineExceeded) && !errors.Is(err, pserver.ErrUnavailable) {
		t.Fatalf("library timeout: %v", err)
	}
}

func TestVector(t *testing.T) {
	v := pserver.Vector[float64](1, 2.5, -3)
	if v.DType() != pserver.Float64 || len(v.Shape()) != 1 || v.Shape()[0] != 3 {
		t.Fatalf("Vector: %v", v)
	}
	if got, _ := pserver.Values[float64](v); got[1] != 2.5 {
		t.Fatalf("Vector values: %v", got)
	}
	if e := pserver.Vector[int32](); e.NumElements() != 0 {
		t.Fatalf("empty Vector: %v", e)
	}
}

// A ctx deadline reaches the library: against a silent server and a client
// Timeout of 30 s, calls with a 200 ms deadline end by it with a
// DEADLINE_EXCEEDED *Error, and Close (which waits for calls in flight)
// returns promptly because the C calls ended too.
func TestContextDeadlineReachesLibrary(t *testing.T) {
	ln := hangingListener(t)
	client, err := pserver.NewClient(context.Background(), pserver.Options{Servers: []string{ln}, Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	calls := map[string]func(ctx context.Context) error{
		"FinishInit": func(ctx context.Context) error { return client.FinishInit(ctx) },
		"Get":        func(ctx context.Context) error { _, err := client.Get(ctx, "w"); return err },
		"SendGrad": func(ctx context.Context) error {
			return client.SendGrad(ctx, "w", mustTensor(t, []float32{1}))
		},
	}
	for name, call := range calls {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		start := time.Now()
		err := call(ctx)
		cancel()
		var perr *pserver.Error
		if !errors.As(err, &perr) || perr.Code != pserver.DeadlineExceeded || !errors.Is(err, pserver.ErrDeadlineExceeded) {
			t.Fatalf("%s with a 200 ms deadline: %v", name, err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("%s took %v", name, d)
		}
	}
	// Close waits for the library calls: they ended at their deadlines, not
	// at the client's 30 s Timeout.
	closed := make(chan struct{})
	start := time.Now()
	go func() { client.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close still waiting after 5 s: the library call ignored the ctx deadline")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Close took %v", d)
	}
	if n := pserver.InFlight(client); n != 0 {
		t.Fatalf("%d calls in flight after Close", n)
	}
}

func TestCheckpointReader(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	cluster, client := newCluster(t, 2, &pserver.ServerOptions{CheckpointDir: dir})
	big := make([]float64, 300000) // > 1 MiB: cut into blocks over both shards
	for i := range big {
		big[i] = float64(i) * 0.5
	}
	values := map[string]*pserver.Tensor{
		"big":   mustTensor(t, big, 600, 500),
		"small": mustTensor(t, []int32{-1, 2, -3}),
		"u64":   mustTensor(t, []uint64{math.MaxUint64, 0}),
	}
	for name, v := range values {
		if err := client.Init(ctx, name, v, &pserver.ParamConfig{Optimizer: "add"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := client.FinishInit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := client.SaveCheckpoint(ctx); err != nil {
		t.Fatal(err)
	}
	if err := cluster.SaveCheckpoint(ctx); err != nil {
		t.Fatal(err)
	}
	r, err := pserver.OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if len(r.Checkpoints()) != 2 || !reflect.DeepEqual(r.Names(), []string{"big", "small", "u64"}) {
		t.Fatalf("checkpoints %v names %v", r.Checkpoints(), r.Names())
	}
	if err := r.Verify(); err != nil {
		t.Fatal(err)
	}
	all, err := r.ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range values {
		got := all[name]
		if got.DType() != want.DType() || !reflect.DeepEqual(got.Shape(), want.Shape()) || !reflect.DeepEqual(got.Bytes(), want.Bytes()) {
			t.Fatalf("%s: got %s%v, want %s%v", name, got.DType(), got.Shape(), want.DType(), want.Shape())
		}
	}
	if _, err := r.Read("missing"); !errors.Is(err, pserver.ErrNotFound) {
		t.Fatalf("Read missing: %v", err)
	}
	if _, err := pserver.OpenCheckpoint(t.TempDir()); !errors.Is(err, pserver.ErrNotFound) {
		t.Fatalf("empty dir: %v", err)
	}
	// Damage a data file: Verify and Read report DATA_LOSS.
	damaged := false
	filepath.Walk(r.Checkpoints()[0], func(path string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() && info.Size() > 1000 && filepath.Base(path) != "MANIFEST" && !damaged {
			data, _ := os.ReadFile(path)
			data[len(data)/2] ^= 0xff
			os.WriteFile(path, data, 0o644)
			damaged = true
		}
		return nil
	})
	if !damaged {
		t.Fatal("no data file to damage")
	}
	if err := r.Verify(); !errors.Is(err, pserver.ErrDataLoss) {
		t.Fatalf("Verify of a damaged checkpoint: %v", err)
	}
	r.Close()
	r.Close()
	if _, err := r.Read("big"); !errors.Is(err, pserver.ErrClosed) {
		t.Fatalf("Read after Close: %v", err)
	}
}
