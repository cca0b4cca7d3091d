package pserver

// #include <stdlib.h>
// #include <string.h>
// #include "pserver.h"
import "C"

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"sort"
	"sync"
	"time"
	"unsafe"
)

// Consistency is when a table's reads wait for slower workers
// (pserver_consistency_t).
type Consistency int32

// The consistency models.
const (
	// ASP: reads never wait.
	ASP Consistency = 0
	// BSP: SSP with staleness 0, and adds are held until every worker has
	// passed the clock they were made at.
	BSP Consistency = 1
	// SSP: a read at clock c waits until every worker has reached c -
	// Staleness.
	SSP Consistency = 2
)

// KeyRange is a range partitioning's keys, [Begin, End) (End 0: 2^64):
// split into one contiguous range per server.
type KeyRange struct {
	Begin, End uint64
}

// TableConfig says what a table holds and how the servers update it
// (pserver.v1.TableConfig, docs/tables.md). Zero values are the defaults.
type TableConfig struct {
	// Dim is the values per row, 1 .. 2^20 (required unless Text sets it).
	Dim uint32
	// DType is Float32 (the default) or Float64.
	DType DType
	// Initializer fills new rows: "zeros" (default), "uniform" (settings
	// "low", "high") or "normal" ("mean", "stddev"); Seed makes it
	// deterministic per (seed, key, column).
	Initializer string
	Seed        uint64
	// Optimizer is the per-row optimizer: "sgd" (default), "adagrad",
	// "adam", "ftrl" or "add" (a KV table).
	Optimizer string
	// Settings are numeric settings by their name in table.proto: the
	// optimizer's ("learning_rate" or "lr", "beta1", ...) and the
	// initializer's ("stddev", ...) (pserver_table_config_set).
	Settings map[string]float64
	// Eviction: rows untouched for TTL, rows over Capacity per server (least
	// recently touched first), and keys seen fewer than AdmissionCount times
	// (not given a row yet). Zero turns a rule off.
	TTL            time.Duration
	Capacity       uint64
	AdmissionCount uint32
	// Range partitions keys by range; nil hashes them.
	Range *KeyRange
	// Consistency and, for SSP, Staleness in clocks.
	Consistency Consistency
	Staleness   uint32
	// ChunkSize is the keys per chunk of KvWorker.GetChunk (default 1).
	ChunkSize uint32
	// WireType is how pushed gradient rows and pulled rows of a Float32
	// table travel: "float16", "bfloat16", or "" (as stored). Top-k with
	// error feedback is the Settings "topk_fraction" or "topk_count" (the
	// rows of a push with the largest L2 norm; the rest kept per row on
	// this client), with "max_residual_rows" (default 1,048,576).
	WireType string
	// Text, when set, is a pserver.v1.TableConfig in protobuf text format,
	// read first; the other fields amend it where they are not zero.
	Text string
}

func (tc *TableConfig) toC() (*C.pserver_table_config_t, error) {
	cfg := C.pserver_table_config_new()
	str := func(s string, f func(c *C.char)) {
		c := C.CString(s)
		defer C.free(unsafe.Pointer(c))
		f(c)
	}
	err := cCall(func(st *C.pserver_status_t) {
		failed := func() bool { return C.pserver_status_code(st) != 0 }
		if tc.Text != "" {
			if str(tc.Text, func(c *C.char) { C.pserver_table_config_parse_text(cfg, c, st) }); failed() {
				return
			}
		} else if tc.Dim == 0 {
			msg := C.CString("a table config needs Dim (or Text)")
			C.pserver_status_set(st, C.int32_t(InvalidArgument), msg)
			C.free(unsafe.Pointer(msg))
			return
		}
		if tc.Dim != 0 {
			if C.pserver_table_config_set_dim(cfg, C.uint32_t(tc.Dim), st); failed() {
				return
			}
		}
		if tc.DType != 0 {
			if C.pserver_table_config_set_dtype(cfg, C.int32_t(tc.DType), st); failed() {
				return
			}
		}
		if tc.Initializer != "" {
			if str(tc.Initializer, func(c *C.char) { C.pserver_table_config_set_initializer(cfg, c, st) }); failed() {
				return
			}
		}
		if tc.Optimizer != "" {
			if str(tc.Optimizer, func(c *C.char) { C.pserver_table_config_set_optimizer(cfg, c, st) }); failed() {
				return
			}
		}
		if tc.WireType != "" {
			if str(tc.WireType, func(c *C.char) { C.pserver_table_config_set_wire_type(cfg, c, st) }); failed() {
				return
			}
		}
		if tc.Range != nil {
			C.pserver_table_config_set_partitioning(cfg, C.PSERVER_PARTITION_RANGE,
				C.uint64_t(tc.Range.Begin), C.uint64_t(tc.Range.End), st)
			if failed() {
				return
			}
		}
		if tc.Consistency != ASP || tc.Staleness != 0 {
			if C.pserver_table_config_set_consistency(cfg, C.int32_t(tc.Consistency), C.uint32_t(tc.Staleness), st); failed() {
				return
			}
		}
		settings := map[string]float64{}
		for k, v := range tc.Settings {
			settings[k] = v
		}
		if tc.Seed != 0 {
			settings["seed"] = float64(tc.Seed)
		}
		if tc.TTL != 0 {
			settings["ttl_seconds"] = tc.TTL.Seconds()
		}
		if tc.Capacity != 0 {
			settings["capacity"] = float64(tc.Capacity)
		}
		if tc.AdmissionCount != 0 {
			settings["admission_count"] = float64(tc.AdmissionCount)
		}
		if tc.ChunkSize != 0 {
			settings["chunk_size"] = float64(tc.ChunkSize)
		}
		keys := make([]string, 0, len(settings))
		for k := range settings {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if str(k, func(c *C.char) { C.pserver_table_config_set(cfg, c, C.double(settings[k]), st) }); failed() {
				return
			}
		}
	})
	if err != nil {
		C.pserver_table_config_delete(cfg)
		return nil, err
	}
	return cfg, nil
}

// Float is an element type a table can hold.
type Float interface {
	float32 | float64
}

// Table is a client's handle on one table spread over every server: uint64
// keys mapped to rows of Dim values. Safe for concurrent use. Closed with
// its client.
type Table struct {
	t     *C.pserver_table_t
	life  lifecycle
	cl    *Client
	name  string
	dim   int
	dtype DType
	chunk int
}

// CreateTable creates table name on every server (again with the same
// config it opens the existing table). ErrInvalidArgument for a bad config,
// ErrAlreadyExists when the table exists with another config.
//
//	emb, err := client.CreateTable(ctx, "emb", pserver.TableConfig{Dim: 16, Optimizer: "adagrad",
//		Initializer: "normal", Settings: map[string]float64{"stddev": 0.01, "lr": 0.05}})
func (cl *Client) CreateTable(ctx context.Context, name string, config TableConfig) (*Table, error) {
	cfg, err := config.toC()
	if err != nil {
		return nil, fmt.Errorf("pserver: create table %q: %w", name, err)
	}
	cname := C.CString(name)
	var ct *C.pserver_table_t
	owned := false // set by after: false when ctx ended first
	err = cl.run(ctx, func(c *C.pserver_client_t, st *C.pserver_status_t) {
		ct = C.pserver_client_create_table(c, cname, C.size_t(len(name)), cfg, st)
	}, func(error) { owned = true }, func() {
		C.free(unsafe.Pointer(cname))
		C.pserver_table_config_delete(cfg)
		if !owned {
			C.pserver_table_delete(ct) // nobody will get the handle
		}
	})
	if err != nil {
		return nil, fmt.Errorf("pserver: create table %q: %w", name, err)
	}
	t := &Table{
		t:     ct,
		cl:    cl,
		name:  name,
		dim:   int(C.pserver_table_dim(ct)),
		dtype: DType(C.pserver_table_dtype(ct)),
		chunk: int(C.pserver_table_chunk_size(ct)),
	}
	cl.adopt(t)
	runtime.SetFinalizer(t, func(t *Table) { t.Close() })
	return t, nil
}

// Name is the table's name.
func (t *Table) Name() string { return t.name }

// Dim is the values per row.
func (t *Table) Dim() int { return t.dim }

// DType is Float32 or Float64.
func (t *Table) DType() DType { return t.dtype }

// ChunkSize is the keys per chunk of KvWorker.GetChunk.
func (t *Table) ChunkSize() int { return t.chunk }

// Config is the table's config in protobuf text format ("" after Close).
func (t *Table) Config() string {
	if t.life.begin() != nil {
		return ""
	}
	defer t.life.end()
	n := C.pserver_table_config_text_of(t.t, nil, 0)
	buf := cAlloc(int(n) + 1)
	defer buf.free()
	C.pserver_table_config_text_of(t.t, (*C.char)(buf.p), n+1)
	return C.GoStringN((*C.char)(buf.p), C.int(n))
}

// ServerOf is the index of the server holding key; ErrInvalidArgument for
// a key outside a range partitioning.
func (t *Table) ServerOf(key uint64) (int, error) {
	if err := t.life.begin(); err != nil {
		return 0, err
	}
	defer t.life.end()
	var s C.int32_t
	if err := cCall(func(st *C.pserver_status_t) { s = C.pserver_table_server_of(t.t, C.uint64_t(key), st) }); err != nil {
		return 0, fmt.Errorf("pserver: table %q: server of %d: %w", t.name, key, err)
	}
	return int(s), nil
}

// Close frees the handle (the table stays on the servers); safe to call
// twice, and waits for calls in flight.
func (t *Table) Close() error {
	if t.life.close(func() { C.pserver_table_delete(t.t); t.t = nil }) {
		runtime.SetFinalizer(t, nil)
		t.cl.disown(t)
	}
	return nil
}

// rowsMem is the memory of a []float32 or []float64 of `rows` rows of the
// table, checked: the table's type, rows * Dim values.
func (t *Table) rowsMem(values interface{}, rows int, what string) (unsafe.Pointer, int, error) {
	var p unsafe.Pointer
	var n int
	var dtype DType
	switch v := values.(type) {
	case []float32:
		p, n, dtype = slicePtr(v), len(v), Float32
	case []float64:
		p, n, dtype = slicePtr(v), len(v), Float64
	default:
		return nil, 0, invalidArgument("%s: want a []float32 or []float64, got %T", what, values)
	}
	if dtype != t.dtype {
		return nil, 0, invalidArgument("%s: table %q holds %s values, got []%s", what, t.name, t.dtype, dtype)
	}
	if n != rows*t.dim {
		return nil, 0, invalidArgument("%s: %d rows of %d values need %d values, got %d", what, rows, t.dim, rows*t.dim, n)
	}
	return p, n * dtype.Size(), nil
}

// cKeys is a C copy of keys.
func cKeys(keys []uint64) cBuf {
	b := cAlloc(8 * len(keys))
	if len(keys) > 0 {
		C.memcpy(b.p, unsafe.Pointer(&keys[0]), C.size_t(8*len(keys)))
	}
	return b
}

// rowsCall runs a pull-like (out) or push-like (in) C call over C copies of
// keys and values.
type rowsFunc func(keys *C.uint64_t, n C.size_t, data unsafe.Pointer, size C.size_t, st *C.pserver_status_t)

func (t *Table) rowsCall(ctx context.Context, lives []*lifecycle, keys []uint64, rows int, values interface{}, out bool, what string, f rowsFunc) error {
	p, size, err := t.rowsMem(values, rows, what)
	if err != nil {
		return err
	}
	ck := cKeys(keys)
	buf := cAlloc(size)
	if !out && size > 0 {
		C.memcpy(buf.p, p, C.size_t(size))
	}
	return runCall(ctx, lives, func(st *C.pserver_status_t) {
		f((*C.uint64_t)(ck.p), C.size_t(len(keys)), buf.p, buf.size(), st)
	}, func(err error) {
		if err == nil && out && size > 0 {
			C.memcpy(p, buf.p, C.size_t(size))
			runtime.KeepAlive(values)
		}
	}, func() { ck.free(); buf.free() })
}

// Pull reads the rows of keys into out, a []float32 or []float64 (the
// table's type) of len(keys) * Dim values, in key order. Rows are created
// on first touch. out is not written when the call fails or ctx ends first.
func (t *Table) Pull(ctx context.Context, keys []uint64, out interface{}) error {
	err := t.rowsCall(ctx, []*lifecycle{&t.cl.life, &t.life}, keys, len(keys), out, true, "pull",
		func(k *C.uint64_t, n C.size_t, data unsafe.Pointer, size C.size_t, st *C.pserver_status_t) {
			C.pserver_table_pull(t.t, k, n, data, size, st)
		})
	if err != nil {
		return fmt.Errorf("pserver: pull from table %q: %w", t.name, err)
	}
	return nil
}

// Push applies grads (len(keys) * Dim values of the table's type) to the
// rows of keys with the table's optimizer; duplicate keys are summed.
func (t *Table) Push(ctx context.Context, keys []uint64, grads interface{}) error {
	err := t.rowsCall(ctx, []*lifecycle{&t.cl.life, &t.life}, keys, len(keys), grads, false, "push",
		func(k *C.uint64_t, n C.size_t, data unsafe.Pointer, size C.size_t, st *C.pserver_status_t) {
			C.pserver_table_push(t.t, k, n, data, size, st)
		})
	if err != nil {
		return fmt.Errorf("pserver: push to table %q: %w", t.name, err)
	}
	return nil
}

// PullRows reads the rows of keys into a new slice of len(keys) * Dim
// values; T must be the table's type.
//
//	rows, err := pserver.PullRows[float32](ctx, emb, []uint64{1, 2, 3})
func PullRows[T Float](ctx context.Context, t *Table, keys []uint64) ([]T, error) {
	out := make([]T, len(keys)*t.dim)
	if err := t.Pull(ctx, keys, out); err != nil {
		return nil, err
	}
	return out, nil
}

// TableStats is a table on one server.
type TableStats struct {
	Server      int
	Rows        uint64 // rows held (admitted, not evicted)
	Bytes       uint64 // values and optimizer state of those rows
	Evictions   uint64 // rows evicted so far (TTL and capacity)
	PendingKeys uint64 // keys seen but not yet admitted
	KeysPulled  uint64
	KeysPushed  uint64
	MinClock    int64  // the slowest registered worker's clock; -1: none
	Workers     uint32 // registered workers
}

// Stats is the table on every server, in index order.
func (t *Table) Stats(ctx context.Context) ([]TableStats, error) {
	const capacity = 1024
	size := C.size_t(unsafe.Sizeof(C.pserver_table_stats_t{}))
	buf := cAlloc(int(size) * capacity)
	var n C.size_t
	var stats []TableStats
	err := runCall(ctx, []*lifecycle{&t.cl.life, &t.life}, func(st *C.pserver_status_t) {
		n = C.pserver_table_stats(t.t, (*C.pserver_table_stats_t)(buf.p), capacity, size, st)
	}, func(err error) {
		if err != nil {
			return
		}
		for i := 0; i < int(n) && i < capacity; i++ {
			s := (*C.pserver_table_stats_t)(unsafe.Add(buf.p, i*int(size)))
			stats = append(stats, TableStats{
				Server:      int(s.server),
				Rows:        uint64(s.rows),
				Bytes:       uint64(s.bytes),
				Evictions:   uint64(s.evictions),
				PendingKeys: uint64(s.pending_keys),
				KeysPulled:  uint64(s.keys_pulled),
				KeysPushed:  uint64(s.keys_pushed),
				MinClock:    int64(s.min_clock),
				Workers:     uint32(s.workers),
			})
		}
	}, buf.free)
	if err != nil {
		return nil, fmt.Errorf("pserver: stats of table %q: %w", t.name, err)
	}
	return stats, nil
}

// KvWorker is one worker of a table with clocks: it reads at its clock,
// waiting for slower workers as the table's consistency says, adds, and
// advances its clock. Its calls are serialized (one worker per goroutine is
// the intended use). Close leaves the table; it is closed with its client.
type KvWorker struct {
	w     *C.pserver_kv_worker_t
	life  lifecycle
	mu    sync.Mutex // serializes the C calls, abandoned ones too
	table *Table
	id    string
}

// Join registers worker (non-empty, unique per table) on every server, at
// the slowest registered worker's clock.
func (t *Table) Join(ctx context.Context, worker string) (*KvWorker, error) {
	cid := C.CString(worker)
	var cw *C.pserver_kv_worker_t
	owned := false // set by after: false when ctx ended first
	err := runCall(ctx, []*lifecycle{&t.cl.life, &t.life}, func(st *C.pserver_status_t) {
		cw = C.pserver_kv_worker_join(t.t, cid, st)
	}, func(error) { owned = true }, func() {
		C.free(unsafe.Pointer(cid))
		if !owned {
			C.pserver_kv_worker_delete(cw) // leaves: nobody will get the handle
		}
	})
	if err != nil {
		return nil, fmt.Errorf("pserver: join table %q as %q: %w", t.name, worker, err)
	}
	w := &KvWorker{w: cw, table: t, id: worker}
	t.cl.adopt(w)
	runtime.SetFinalizer(w, func(w *KvWorker) { w.Close() })
	return w, nil
}

// ID is the worker's id.
func (w *KvWorker) ID() string { return w.id }

// Table is the worker's table.
func (w *KvWorker) Table() *Table { return w.table }

// CurrentClock is the worker's clock (advanced by Clock); 0 after Close.
func (w *KvWorker) CurrentClock() int64 {
	if w.life.begin() != nil {
		return 0
	}
	defer w.life.end()
	w.mu.Lock()
	defer w.mu.Unlock()
	return int64(C.pserver_kv_worker_current_clock(w.w))
}

func (w *KvWorker) lives() []*lifecycle { return []*lifecycle{&w.table.cl.life, &w.life} }

func (w *KvWorker) rows(ctx context.Context, keys []uint64, rows int, values interface{}, out bool, what string, f rowsFunc) error {
	err := w.table.rowsCall(ctx, w.lives(), keys, rows, values, out, what,
		func(k *C.uint64_t, n C.size_t, data unsafe.Pointer, size C.size_t, st *C.pserver_status_t) {
			w.mu.Lock()
			defer w.mu.Unlock()
			f(k, n, data, size, st)
		})
	if err != nil {
		return fmt.Errorf("pserver: %s table %q as %q: %w", what, w.table.name, w.id, err)
	}
	return nil
}

// Get reads the rows of keys at the worker's clock into out (as
// Table.Pull). Under SSP (BSP) it waits until every worker has reached the
// clock minus the staleness (0); on ctx's deadline the DEADLINE_EXCEEDED
// error names the workers holding it back.
func (w *KvWorker) Get(ctx context.Context, keys []uint64, out interface{}) error {
	return w.rows(ctx, keys, len(keys), out, true, "get from",
		func(k *C.uint64_t, n C.size_t, data unsafe.Pointer, size C.size_t, st *C.pserver_status_t) {
			C.pserver_kv_worker_get(w.w, k, n, data, size, st)
		})
}

// Add adds vals (len(keys) * Dim values) to the rows of keys at the
// worker's clock.
func (w *KvWorker) Add(ctx context.Context, keys []uint64, vals interface{}) error {
	return w.rows(ctx, keys, len(keys), vals, false, "add to",
		func(k *C.uint64_t, n C.size_t, data unsafe.Pointer, size C.size_t, st *C.pserver_status_t) {
			C.pserver_kv_worker_add(w.w, k, n, data, size, st)
		})
}

// GetChunk reads whole chunks (chunk c is keys [c * ChunkSize, (c + 1) *
// ChunkSize)) into out: len(chunks) * ChunkSize rows.
func (w *KvWorker) GetChunk(ctx context.Context, chunks []uint64, out interface{}) error {
	return w.rows(ctx, chunks, len(chunks)*w.table.chunk, out, true, "get chunks from",
		func(k *C.uint64_t, n C.size_t, data unsafe.Pointer, size C.size_t, st *C.pserver_status_t) {
			C.pserver_kv_worker_get_chunk(w.w, k, n, data, size, st)
		})
}

// AddChunk adds vals (len(chunks) * ChunkSize rows) to whole chunks.
func (w *KvWorker) AddChunk(ctx context.Context, chunks []uint64, vals interface{}) error {
	return w.rows(ctx, chunks, len(chunks)*w.table.chunk, vals, false, "add chunks to",
		func(k *C.uint64_t, n C.size_t, data unsafe.Pointer, size C.size_t, st *C.pserver_status_t) {
			C.pserver_kv_worker_add_chunk(w.w, k, n, data, size, st)
		})
}

// Clock advances the worker's clock by one on every server.
func (w *KvWorker) Clock(ctx context.Context) error {
	err := runCall(ctx, w.lives(), func(st *C.pserver_status_t) {
		w.mu.Lock()
		defer w.mu.Unlock()
		C.pserver_kv_worker_clock(w.w, st)
	}, nopErr, nop)
	if err != nil {
		return fmt.Errorf("pserver: clock of %q on table %q: %w", w.id, w.table.name, err)
	}
	return nil
}

// Leave unregisters the worker so it no longer holds the others back;
// later calls fail with ErrFailedPrecondition.
func (w *KvWorker) Leave(ctx context.Context) error {
	err := runCall(ctx, w.lives(), func(st *C.pserver_status_t) {
		w.mu.Lock()
		defer w.mu.Unlock()
		C.pserver_kv_worker_leave(w.w, st)
	}, nopErr, nop)
	if err != nil {
		return fmt.Errorf("pserver: leave table %q as %q: %w", w.table.name, w.id, err)
	}
	return nil
}

// Close leaves the table unless the worker left (best effort, at most 5 s)
// and frees the handle; safe to call twice, and waits for calls in flight.
func (w *KvWorker) Close() error {
	if w.life.close(func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		C.pserver_kv_worker_delete(w.w)
		w.w = nil
	}) {
		runtime.SetFinalizer(w, nil)
		w.table.cl.disown(w)
	}
	return nil
}

// BarrierScope is who a barrier waits for (pserver_barrier_scope_t).
type BarrierScope int32

// The barrier scopes.
const (
	BarrierWorkers BarrierScope = 0 // every member of the group
	BarrierServers BarrierScope = 1 // every server is serving and has answered
	BarrierAll     BarrierScope = 2 // both
)

// ReduceOp is how AllReduce combines the members' tensors.
type ReduceOp int32

// The reductions.
const (
	ReduceSum  ReduceOp = 0
	ReduceMean ReduceOp = 1
)

// Group is one member's handle on a group of workers, for barriers,
// all-reduce and broadcast through the servers. Every member makes the same
// sequence of calls: the k-th call of a kind meets the others' k-th call.
// Its calls are serialized; one Group per worker goroutine. Closed with its
// client.
type Group struct {
	g           *C.pserver_group_t
	life        lifecycle
	mu          sync.Mutex
	cl          *Client
	name        string
	size        int
	participant string
}

// Group is member participant (non-empty, unique in the group) of group
// name of size >= 1 members. Sends nothing.
//
//	g, err := client.Group("trainers", 4, fmt.Sprint("w", rank))
//	err = g.AllReduce(ctx, grad, pserver.ReduceMean)
func (cl *Client) Group(name string, size int, participant string) (*Group, error) {
	if size < 1 || int64(size) > math.MaxUint32 {
		return nil, fmt.Errorf("pserver: group %q: %w", name, invalidArgument("a group needs at least 1 member, got %d", size))
	}
	cname, cpart := C.CString(name), C.CString(participant)
	defer C.free(unsafe.Pointer(cname))
	defer C.free(unsafe.Pointer(cpart))
	var cg *C.pserver_group_t
	err := runCall(context.Background(), []*lifecycle{&cl.life}, func(st *C.pserver_status_t) {
		cg = C.pserver_group_new(cl.c, cname, C.uint32_t(size), cpart, st)
	}, nopErr, nop)
	if err != nil {
		return nil, fmt.Errorf("pserver: group %q: %w", name, err)
	}
	g := &Group{g: cg, cl: cl, name: name, size: size, participant: participant}
	cl.adopt(g)
	runtime.SetFinalizer(g, func(g *Group) { g.Close() })
	return g, nil
}

// Name is the group's name.
func (g *Group) Name() string { return g.name }

// Size is the number of members.
func (g *Group) Size() int { return g.size }

// Participant is this member's id.
func (g *Group) Participant() string { return g.participant }

func (g *Group) call(ctx context.Context, what string, f func(st *C.pserver_status_t), after func(error), free func()) error {
	err := runCall(ctx, []*lifecycle{&g.cl.life, &g.life}, func(st *C.pserver_status_t) {
		g.mu.Lock()
		defer g.mu.Unlock()
		f(st)
	}, after, free)
	if err != nil {
		return fmt.Errorf("pserver: %s in group %q as %q: %w", what, g.name, g.participant, err)
	}
	return nil
}

// Barrier waits for the members, the servers or both. On ctx's deadline
// the DEADLINE_EXCEEDED error says how many members arrived and who.
func (g *Group) Barrier(ctx context.Context, scope BarrierScope) error {
	return g.call(ctx, "barrier", func(st *C.pserver_status_t) {
		C.pserver_group_barrier(g.g, C.int32_t(scope), st)
	}, nopErr, nop)
}

// inPlace runs a collective on a C copy of t and copies the result back.
func (g *Group) inPlace(ctx context.Context, what string, t *Tensor, f func(shape *C.int64_t, ndim C.size_t, data unsafe.Pointer, size C.size_t, st *C.pserver_status_t)) error {
	if t == nil {
		return fmt.Errorf("pserver: %s in group %q: %w", what, g.name, invalidArgument("tensor is nil"))
	}
	buf := cCopy(t)
	shape, freeShape := cShape(t.shape)
	return g.call(ctx, what, func(st *C.pserver_status_t) {
		f(shape, C.size_t(len(t.shape)), buf.p, buf.size(), st)
	}, func(err error) {
		if err == nil {
			buf.copyTo(t)
		}
	}, func() { buf.free(); freeShape() })
}

// AllReduce replaces t's elements in place by the element-wise sum (or
// mean) over every member's tensor, which must have t's type and shape.
func (g *Group) AllReduce(ctx context.Context, t *Tensor, op ReduceOp) error {
	return g.inPlace(ctx, "all-reduce", t, func(shape *C.int64_t, ndim C.size_t, data unsafe.Pointer, size C.size_t, st *C.pserver_status_t) {
		C.pserver_group_all_reduce(g.g, C.int32_t(t.dtype), shape, ndim, data, size, C.int32_t(op), st)
	})
}

// Broadcast copies the root's t into every other member's t (of the root's
// type and shape), in place. Exactly one member passes root = true.
func (g *Group) Broadcast(ctx context.Context, t *Tensor, root bool) error {
	r := C.uint8_t(0)
	if root {
		r = 1
	}
	return g.inPlace(ctx, "broadcast", t, func(shape *C.int64_t, ndim C.size_t, data unsafe.Pointer, size C.size_t, st *C.pserver_status_t) {
		C.pserver_group_broadcast(g.g, C.int32_t(t.dtype), shape, ndim, data, size, r, st)
	})
}

// Close frees the handle; safe to call twice, and waits for calls in
// flight.
func (g *Group) Close() error {
	if g.life.close(func() { C.pserver_group_delete(g.g); g.g = nil }) {
		runtime.SetFinalizer(g, nil)
		g.cl.disown(g)
	}
	return nil
}
