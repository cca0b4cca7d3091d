package pserver_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pserver-project/pserver/go/pserver"
)

func mustTable(t *testing.T, client *pserver.Client, name string, cfg pserver.TableConfig) *pserver.Table {
	t.Helper()
	table, err := client.CreateTable(context.Background(), name, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return table
}

// runGoroutines runs body(rank) on n goroutines and reports their errors.
func runGoroutines(t *testing.T, n int, body func(rank int) error) {
	t.Helper()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := 0; r < n; r++ {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			errs[r] = body(r)
		}(r)
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("member %d: %v", r, err)
		}
	}
}

func TestTablePullPushRoundTrip(t *testing.T) {
	ctx := context.Background()
	_, client := newCluster(t, 2, nil)
	emb := mustTable(t, client, "emb", pserver.TableConfig{Dim: 3, Optimizer: "sgd",
		Settings: map[string]float64{"lr": 0.5}})
	if emb.Name() != "emb" || emb.Dim() != 3 || emb.DType() != pserver.Float32 || emb.ChunkSize() != 1 {
		t.Fatalf("table %s dim %d %s chunk %d", emb.Name(), emb.Dim(), emb.DType(), emb.ChunkSize())
	}
	keys := []uint64{4, 1 << 63, 4}
	rows, err := pserver.PullRows[float32](ctx, emb, keys)
	if err != nil || !reflect.DeepEqual(rows, make([]float32, 9)) {
		t.Fatalf("fresh rows %v %v", rows, err)
	}
	// Duplicate keys are summed: key 4 gets 1 + 3.
	if err := emb.Push(ctx, keys, []float32{1, 1, 1, 2, 2, 2, 3, 3, 3}); err != nil {
		t.Fatal(err)
	}
	out := make([]float32, 6)
	if err := emb.Pull(ctx, []uint64{4, 1 << 63}, out); err != nil {
		t.Fatal(err)
	}
	if want := []float32{-2, -2, -2, -1, -1, -1}; !reflect.DeepEqual(out, want) {
		t.Fatalf("rows %v, want %v", out, want)
	}
	if !strings.Contains(emb.Config(), "sgd { learning_rate: 0.5 }") {
		t.Fatalf("config %q", emb.Config())
	}
	stats, err := emb.Stats(ctx)
	if err != nil || len(stats) != 2 {
		t.Fatalf("stats %v %v", stats, err)
	}
	var held, pushed uint64
	for i, s := range stats {
		if s.Server != i || s.MinClock != -1 || s.Workers != 0 {
			t.Fatalf("stats %+v", s)
		}
		held += s.Rows
		pushed += s.KeysPushed
	}
	if held != 2 || pushed < 3 {
		t.Fatalf("rows %d pushed %d", held, pushed)
	}
}

func TestTableConfigAndErrors(t *testing.T) {
	ctx := context.Background()
	_, client := newCluster(t, 2, nil)
	cfg := pserver.TableConfig{Dim: 4, DType: pserver.Float64, Initializer: "normal", Seed: 9,
		Settings: map[string]float64{"stddev": 0.1}, Range: &pserver.KeyRange{Begin: 0, End: 1000},
		Capacity: 100, TTL: time.Minute, ChunkSize: 2}
	a := mustTable(t, client, "n", cfg)
	b := mustTable(t, client, "n", cfg) // the same config opens it
	for _, want := range []string{"element_type: FLOAT64", "normal { stddev: 0.1 } seed: 9",
		"ttl_seconds: 60 capacity: 100", "kind: RANGE range_end: 1000", "chunk_size: 2"} {
		if !strings.Contains(a.Config(), want) {
			t.Errorf("config %q lacks %q", a.Config(), want)
		}
	}
	keys := []uint64{1, 999}
	ra, err := pserver.PullRows[float64](ctx, a, keys)
	if err != nil {
		t.Fatal(err)
	}
	rb, err := pserver.PullRows[float64](ctx, b, keys)
	if err != nil || !reflect.DeepEqual(ra, rb) || ra[0] == 0 {
		t.Fatalf("initializer not deterministic: %v %v %v", ra, rb, err)
	}
	if s0, _ := a.ServerOf(1); s0 != 0 {
		t.Errorf("ServerOf(1) = %d", s0)
	}
	if s1, _ := a.ServerOf(999); s1 != 1 {
		t.Errorf("ServerOf(999) = %d", s1)
	}

	for _, c := range []struct {
		name string
		err  error
		want string
	}{
		{"float32 rows for a float64 table", a.Pull(ctx, keys, make([]float32, 8)), "holds float64 values"},
		{"short out", a.Pull(ctx, keys, make([]float64, 7)), "need 8 values, got 7"},
		{"not floats", a.Push(ctx, keys, []int64{1}), "want a []float32 or []float64"},
		{"key outside the range", a.Pull(ctx, []uint64{1000}, make([]float64, 4)), "outside"},
		{"NaN", a.Push(ctx, keys[:1], []float64{0, math.NaN(), 0, 0}), "key 1"},
	} {
		if !errors.Is(c.err, pserver.ErrInvalidArgument) || !strings.Contains(c.err.Error(), c.want) {
			t.Errorf("%s: got %v, want INVALID_ARGUMENT with %q", c.name, c.err, c.want)
		}
	}
	for _, c := range []struct {
		cfg  pserver.TableConfig
		code error
		want string
	}{
		{pserver.TableConfig{Dim: 3}, pserver.ErrAlreadyExists, "another config"},
		{pserver.TableConfig{}, pserver.ErrInvalidArgument, "needs Dim"},
		{pserver.TableConfig{Dim: 2, DType: pserver.Int32}, pserver.ErrInvalidArgument, "float32 or float64"},
		{pserver.TableConfig{Dim: 2, Optimizer: "adadelta"}, pserver.ErrInvalidArgument, "unknown table optimizer"},
		{pserver.TableConfig{Dim: 2, Settings: map[string]float64{"momentum": 1}}, pserver.ErrInvalidArgument, "valid settings"},
		{pserver.TableConfig{Text: "dim: x"}, pserver.ErrInvalidArgument, "text format"},
	} {
		_, err := client.CreateTable(ctx, "n", c.cfg)
		if !errors.Is(err, c.code) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("CreateTable(%+v): got %v, want %v with %q", c.cfg, err, c.code, c.want)
		}
	}
	txt := mustTable(t, client, "txt", pserver.TableConfig{Text: "dim: 2 optimizer { adam { beta1: 0.8 } }",
		Settings: map[string]float64{"lr": 0.01}})
	if txt.Dim() != 2 || !strings.Contains(txt.Config(), "adam { learning_rate: 0.01 beta1: 0.8 }") {
		t.Fatalf("text config: dim %d %q", txt.Dim(), txt.Config())
	}
}

func kvTable(t *testing.T, client *pserver.Client, name string, c pserver.Consistency, staleness uint32) *pserver.Table {
	return mustTable(t, client, name, pserver.TableConfig{Dim: 1, DType: pserver.Float64, Optimizer: "add",
		Consistency: c, Staleness: staleness})
}

func TestKvWorkersSSPWaitNamesTheStraggler(t *testing.T) {
	ctx := context.Background()
	cluster, client := newCluster(t, 2, nil)
	const n = 3
	keys := []uint64{0, 1, 2}
	vals := make([]float64, n)

	// A client whose own timeout is short: the library's error comes back
	// as it is, naming the straggler.
	quick, err := pserver.NewClient(ctx, pserver.Options{Servers: cluster.Addresses(), Timeout: 4 * time.Second}) // the server answers 1 s before
	if err != nil {
		t.Fatal(err)
	}
	defer quick.Close()
	lag := kvTable(t, quick, "lag", pserver.SSP, 1)
	w0, err := lag.Join(ctx, "w0")
	if err != nil {
		t.Fatal(err)
	}
	fast, err := lag.Join(ctx, "w1")
	if err != nil {
		t.Fatal(err)
	}
	for c := 0; c < 2; c++ { // within the staleness: no wait
		if err := fast.Get(ctx, keys, vals); err != nil {
			t.Fatal(err)
		}
		if err := fast.Add(ctx, []uint64{1}, []float64{1}); err != nil {
			t.Fatal(err)
		}
		if err := fast.Clock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if fast.CurrentClock() != 2 {
		t.Fatalf("clock %d", fast.CurrentClock())
	}
	start := time.Now()
	err = fast.Get(ctx, keys, vals)
	if !errors.Is(err, pserver.ErrDeadlineExceeded) || !strings.Contains(err.Error(), "w0 at clock 0") {
		t.Fatalf("straggler wait: %v", err)
	}
	if time.Since(start) > 60*time.Second {
		t.Fatalf("the wait took %v", time.Since(start))
	}
	// A ctx deadline ends it too: the library's error naming w0 (the
	// servers end the wait a little before the deadline), or ctx's own.
	fast2, err := kvTable(t, client, "lag", pserver.SSP, 1).Join(ctx, "w2")
	if err != nil {
		t.Fatal(err)
	}
	for c := 0; c < 2; c++ {
		if err := fast2.Clock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err = fast2.Get(short, keys, vals)
	cancel()
	if !errors.Is(err, pserver.ErrDeadlineExceeded) ||
		!(strings.Contains(err.Error(), "w0 at clock 0") || errors.Is(err, context.DeadlineExceeded)) {
		t.Fatalf("straggler wait with a ctx deadline: %v", err)
	}
	w0.Close()
	fast.Close()
	fast2.Close()

	kv := kvTable(t, client, "ssp", pserver.SSP, 1)
	workers := make([]*pserver.KvWorker, n)
	for w := range workers {
		var err error
		if workers[w], err = kv.Join(ctx, fmt.Sprint("w", w)); err != nil {
			t.Fatal(err)
		}
	}
	// All run; every read respects the bound.
	const clocks = 6
	tctx, tcancel := context.WithTimeout(ctx, 30*time.Second)
	defer tcancel()
	runGoroutines(t, n, func(w int) error {
		worker := workers[w]
		read := make([]float64, n)
		for worker.CurrentClock() < clocks {
			c := float64(worker.CurrentClock())
			if err := worker.Get(tctx, keys, read); err != nil {
				return err
			}
			for other := range read {
				if read[other] < c-1 {
					return fmt.Errorf("clock %v: worker %d's value %v is staler than 1", c, other, read[other])
				}
			}
			if read[w] != c {
				return fmt.Errorf("clock %v: reads its own %v", c, read[w])
			}
			if err := worker.Add(tctx, []uint64{uint64(w)}, []float64{1}); err != nil {
				return err
			}
			if err := worker.Clock(tctx); err != nil {
				return err
			}
		}
		return nil
	})
	for _, w := range workers {
		w.Close()
		w.Close()
	}
	stats, err := kv.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range stats {
		if s.Workers != 0 {
			t.Fatalf("workers left registered: %+v", s)
		}
	}
}

func TestKvWorkersBSPReadExactlyTheEarlierClocks(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cluster, _ := newCluster(t, 2, nil)
	client, err := cluster.Client(ctx, pserver.Options{}) // in process
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	kv := kvTable(t, client, "bsp", pserver.BSP, 0)
	const n, clocks = 3, 5
	keys := []uint64{0, 1, 2}
	workers := make([]*pserver.KvWorker, n)
	for w := range workers { // all join before any runs
		if workers[w], err = kv.Join(ctx, fmt.Sprint("w", w)); err != nil {
			t.Fatal(err)
		}
	}
	runGoroutines(t, n, func(w int) error {
		read := make([]float64, n)
		for c := 0; c < clocks; c++ {
			if err := workers[w].Get(ctx, keys, read); err != nil {
				return err
			}
			for _, v := range read {
				if v != float64(c) {
					return fmt.Errorf("clock %d read %v", c, read)
				}
			}
			if err := workers[w].Add(ctx, []uint64{uint64(w)}, []float64{1}); err != nil {
				return err
			}
			if err := workers[w].Clock(ctx); err != nil {
				return err
			}
		}
		return nil
	})
	if err := workers[0].Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if err := workers[0].Get(ctx, keys, make([]float64, n)); !errors.Is(err, pserver.ErrFailedPrecondition) {
		t.Fatalf("get after leave: %v", err)
	}
}

func TestKvWorkerChunksAndClientClose(t *testing.T) {
	ctx := context.Background()
	cluster, _ := newCluster(t, 2, nil)
	client, err := cluster.Client(ctx, pserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	kv := mustTable(t, client, "chunks", pserver.TableConfig{Dim: 2, Optimizer: "add", ChunkSize: 3})
	w, err := kv.Join(ctx, "solo")
	if err != nil {
		t.Fatal(err)
	}
	if w.ID() != "solo" || w.Table() != kv {
		t.Fatal("worker id or table")
	}
	ones := []float32{1, 1, 1, 1, 1, 1}
	if err := w.AddChunk(ctx, []uint64{1}, ones); err != nil {
		t.Fatal(err)
	}
	rows := make([]float32, 12)
	if err := w.GetChunk(ctx, []uint64{0, 1}, rows); err != nil {
		t.Fatal(err)
	}
	if want := []float32{0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1}; !reflect.DeepEqual(rows, want) {
		t.Fatalf("chunks %v", rows)
	}
	if err := w.AddChunk(ctx, []uint64{1}, ones[:4]); !errors.Is(err, pserver.ErrInvalidArgument) {
		t.Fatalf("short chunk: %v", err)
	}
	// Closing the client closes its tables and workers (which leave).
	client.Close()
	if err := kv.Pull(ctx, []uint64{1}, make([]float32, 2)); !errors.Is(err, pserver.ErrClosed) {
		t.Fatalf("pull after client close: %v", err)
	}
	if err := w.Clock(ctx); !errors.Is(err, pserver.ErrClosed) {
		t.Fatalf("clock after client close: %v", err)
	}
	other, err := cluster.Client(ctx, pserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	kv2 := mustTable(t, other, "chunks", pserver.TableConfig{Dim: 2, Optimizer: "add", ChunkSize: 3})
	stats, err := kv2.Stats(ctx)
	if err != nil || stats[0].Workers != 0 {
		t.Fatalf("the worker did not leave: %+v %v", stats, err)
	}
}

func TestGroupAllReduceEqualsTheSum(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, client := newCluster(t, 2, nil)
	const n = 3
	results := make([][]float32, n)
	runGoroutines(t, n, func(rank int) error {
		g, err := client.Group("sum", n, fmt.Sprint("w", rank))
		if err != nil {
			return err
		}
		defer g.Close()
		vals := make([]float32, 1000)
		for i := range vals {
			vals[i] = float32(i%7) * float32(rank+1)
		}
		x, _ := pserver.NewTensor(vals, 10, 100)
		if err := g.AllReduce(ctx, x, pserver.ReduceSum); err != nil {
			return err
		}
		results[rank] = vals
		m := pserver.Vector[int64](int64(10*(rank+1)), int64(-rank))
		if err := g.AllReduce(ctx, m, pserver.ReduceMean); err != nil {
			return err
		}
		if got, _ := pserver.Values[int64](m); !reflect.DeepEqual(got, []int64{20, -1}) {
			return fmt.Errorf("mean %v", got)
		}
		return nil
	})
	for _, r := range results {
		for i, v := range r {
			if v != float32(i%7)*6 {
				t.Fatalf("element %d = %v", i, v)
			}
		}
	}
}

func TestGroupBarrierAndBroadcast(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, client := newCluster(t, 2, nil)
	const n = 3
	var mu sync.Mutex
	arrived, early := 0, 0
	runGoroutines(t, n, func(rank int) error {
		g, err := client.Group("bb", n, fmt.Sprint("w", rank))
		if err != nil {
			return err
		}
		defer g.Close()
		for round := 0; round < 3; round++ {
			mu.Lock()
			arrived++
			mu.Unlock()
			scope := pserver.BarrierWorkers
			if round == 1 {
				scope = pserver.BarrierAll
			}
			if err := g.Barrier(ctx, scope); err != nil {
				return err
			}
			mu.Lock()
			if arrived < n*(round+1) {
				early++
			}
			mu.Unlock()
		}
		v := []float64{0, 0, 0}
		if rank == 2 {
			v = []float64{1.5, 2.5, 3.5}
		}
		x := pserver.Vector(v...)
		if err := g.Broadcast(ctx, x, rank == 2); err != nil {
			return err
		}
		if !reflect.DeepEqual(v, []float64{1.5, 2.5, 3.5}) {
			return fmt.Errorf("broadcast %v", v)
		}
		return g.Barrier(ctx, pserver.BarrierServers)
	})
	if early != 0 {
		t.Fatalf("%d members passed a barrier early", early)
	}
}

func TestGroupErrors(t *testing.T) {
	ctx := context.Background()
	_, client := newCluster(t, 2, nil)
	if _, err := client.Group("g", 0, "w0"); !errors.Is(err, pserver.ErrInvalidArgument) {
		t.Fatalf("size 0: %v", err)
	}
	if _, err := client.Group("g", 2, ""); !errors.Is(err, pserver.ErrInvalidArgument) {
		t.Fatalf("no participant: %v", err)
	}
	g, err := client.Group("lonely", 2, "w0")
	if err != nil {
		t.Fatal(err)
	}
	if g.Name() != "lonely" || g.Size() != 2 || g.Participant() != "w0" {
		t.Fatal("group accessors")
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err = g.Barrier(short, pserver.BarrierWorkers)
	cancel()
	if !errors.Is(err, pserver.ErrDeadlineExceeded) {
		t.Fatalf("lonely barrier: %v", err)
	}
	if err := g.Barrier(ctx, pserver.BarrierScope(7)); !errors.Is(err, pserver.ErrInvalidArgument) {
		t.Fatalf("bad scope: %v", err)
	}
	if err := g.AllReduce(ctx, pserver.Vector[float32](1), pserver.ReduceOp(5)); !errors.Is(err, pserver.ErrInvalidArgument) {
		t.Fatalf("bad op: %v", err)
	}
	if err := g.AllReduce(ctx, nil, pserver.ReduceSum); !errors.Is(err, pserver.ErrInvalidArgument) {
		t.Fatalf("nil tensor: %v", err)
	}
	g.Close()
	if err := g.Barrier(ctx, pserver.BarrierWorkers); !errors.Is(err, pserver.ErrClosed) {
		t.Fatalf("after close: %v", err)
	}
	g.Close()
}

func TestTablesInCheckpoints(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	cluster, client := newCluster(t, 2, &pserver.ServerOptions{CheckpointDir: dir})
	kv := mustTable(t, client, "saved", pserver.TableConfig{Dim: 2, DType: pserver.Float64, Optimizer: "add"})
	if err := kv.Push(ctx, []uint64{40, 3, 17}, []float64{0, 1, 2, 3, 4, 5}); err != nil {
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
	if !reflect.DeepEqual(r.Tables(), []string{"saved"}) {
		t.Fatalf("tables %v", r.Tables())
	}
	keys, values, err := r.ReadTable("saved")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := pserver.Values[float64](values)
	if !reflect.DeepEqual(keys, []uint64{3, 17, 40}) || !reflect.DeepEqual(got, []float64{2, 3, 4, 5, 0, 1}) ||
		!reflect.DeepEqual(values.Shape(), []int64{3, 2}) {
		t.Fatalf("keys %v values %v %v", keys, got, values.Shape())
	}
	if _, _, err := r.ReadTable("nope"); !errors.Is(err, pserver.ErrNotFound) {
		t.Fatalf("unknown table: %v", err)
	}
}
