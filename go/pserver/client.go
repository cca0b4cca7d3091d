package pserver

// #include <stdlib.h>
// #include "pserver.h"
import "C"

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"sort"
	"sync"
	"time"
	"unsafe"
)

// Options configure a Client. The zero value of a field means the library's
// default.
type Options struct {
	// Servers, "host:port", in shard-index order. NewClient needs Servers
	// or Etcd.
	Servers []string
	// Etcd, instead of Servers: etcd endpoints "host:port[,host:port...]".
	// NewClient then waits for the cluster's /ps_desired servers to be
	// registered (until ctx's deadline, or 60 s), follows restarted servers
	// and registers the trainer under /pserver/<Cluster>/workers/.
	Etcd string
	// Cluster names the keys under /pserver/<Cluster> ("default").
	Cluster string
	// Timeout bounds every call in the library (default 30 s). A call's ctx
	// deadline, when earlier, bounds that call instead, in the library too
	// (see Client).
	Timeout time.Duration
	// BlockBytes: parameters larger than this are cut into blocks over all
	// servers; every client of a cluster must use the same value (1 MiB).
	BlockBytes uint64
	// MaxRequestBytes caps one request (1 MiB).
	MaxRequestBytes uint64
	// ChannelsPerServer: gRPC channels to each server (2).
	ChannelsPerServer int
	// TLS: mutual TLS to the servers (nil: plaintext).
	TLS *TLS
	// Token is the bearer token sent to servers with roles
	// (--auth_tokens_file; docs/security.md); "": none.
	Token string
	// EtcdTLS, with Etcd: speak to etcd over TLS with a client certificate.
	EtcdTLS *EtcdTLS
	// RequireInstanceID, with Etcd: refuse a /ps/<idx> entry that names no
	// server instance (a bare "host:port", as etcdctl writes it): NewClient
	// fails FAILED_PRECONDITION naming the key, and such an entry seen later
	// is ignored (docs/security.md, registry fencing).
	RequireInstanceID bool
}

func (o *Options) toC() (*C.pserver_client_options_t, error) {
	opts := C.pserver_client_options_new()
	for _, s := range o.Servers {
		cs := C.CString(s)
		C.pserver_client_options_add_server(opts, cs)
		C.free(unsafe.Pointer(cs))
	}
	if o.Timeout < 0 || o.ChannelsPerServer < 0 {
		C.pserver_client_options_delete(opts)
		return nil, invalidArgument("negative Timeout or ChannelsPerServer")
	}
	if o.Timeout > 0 {
		ms := o.Timeout.Milliseconds()
		if ms == 0 {
			ms = 1
		}
		C.pserver_client_options_set_timeout_ms(opts, C.int64_t(ms))
	}
	if o.Etcd != "" {
		ce, cc := C.CString(o.Etcd), C.CString(o.Cluster)
		err := cCall(func(st *C.pserver_status_t) { C.pserver_client_options_set_etcd(opts, ce, cc, st) })
		C.free(unsafe.Pointer(ce))
		C.free(unsafe.Pointer(cc))
		if err != nil {
			C.pserver_client_options_delete(opts)
			return nil, err
		}
	}
	if o.BlockBytes > 0 {
		C.pserver_client_options_set_block_bytes(opts, C.uint64_t(o.BlockBytes))
	}
	if o.MaxRequestBytes > 0 {
		C.pserver_client_options_set_max_request_bytes(opts, C.uint64_t(o.MaxRequestBytes))
	}
	if o.ChannelsPerServer > 0 {
		C.pserver_client_options_set_channels_per_server(opts, C.int32_t(o.ChannelsPerServer))
	}
	if err := o.TLS.applyToClient(opts); err != nil {
		C.pserver_client_options_delete(opts)
		return nil, err
	}
	o.setAuth(opts)
	return opts, nil
}

// ParamConfig says how the servers update a parameter. The zero value is
// plain SGD with learning rate 0.01.
type ParamConfig struct {
	// "sgd", "adagrad", "adadelta", "rmsprop", "adam", "adamw" or "add".
	Optimizer string
	// "constant", "linear", "step" or "cosine".
	Schedule string
	// Numeric settings by their name in config.proto: "learning_rate" (or
	// "lr"), "beta1", "momentum", "clip_norm", ... (pserver_param_config_set).
	Settings map[string]float64
	// Text, when set, replaces everything above: a pserver.v1.ParameterConfig
	// in protobuf text format.
	Text string
}

func (p *ParamConfig) toC() (*C.pserver_param_config_t, error) {
	cfg := C.pserver_param_config_new()
	err := cCall(func(st *C.pserver_status_t) {
		if p.Text != "" {
			ct := C.CString(p.Text)
			defer C.free(unsafe.Pointer(ct))
			C.pserver_param_config_parse_text(cfg, ct, st)
			return
		}
		if p.Optimizer != "" {
			c := C.CString(p.Optimizer)
			defer C.free(unsafe.Pointer(c))
			if C.pserver_param_config_set_optimizer(cfg, c, st); C.pserver_status_code(st) != 0 {
				return
			}
		}
		if p.Schedule != "" {
			c := C.CString(p.Schedule)
			defer C.free(unsafe.Pointer(c))
			if C.pserver_param_config_set_schedule(cfg, c, st); C.pserver_status_code(st) != 0 {
				return
			}
		}
		keys := make([]string, 0, len(p.Settings))
		for k := range p.Settings {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			c := C.CString(k)
			C.pserver_param_config_set(cfg, c, C.double(p.Settings[k]), st)
			C.free(unsafe.Pointer(c))
			if C.pserver_status_code(st) != 0 {
				return
			}
		}
	})
	if err != nil {
		C.pserver_param_config_delete(cfg)
		return nil, err
	}
	return cfg, nil
}

// Client talks to the servers of one cluster. A Client is safe for
// concurrent use by multiple goroutines (many trainer goroutines share one).
//
// Blocking methods take a ctx first. A ctx that is already done fails the
// call at once. ctx's deadline is passed down as the library call's own
// deadline (pserver_status_set_timeout_ms), so the C call ends by then too,
// with DEADLINE_EXCEEDED, and Close does not wait past it. When a ctx can
// end (it has a Done channel), its end cancels the library call itself
// (pserver_cancel_t: its gRPC requests are cancelled and retries stop), and
// the method returns promptly, once the call has, with a DEADLINE_EXCEEDED
// (or CANCELLED) *Error; errors.Is(err, context.DeadlineExceeded) (or
// context.Canceled) holds too. No call is left running behind a returned
// method. A call's effect on the server (a gradient applied) may still
// happen after its ctx ran out, as with any RPC.
type Client struct {
	c       *C.pserver_client_t
	life    lifecycle
	servers []string
	owner   interface{} // keeps a LocalCluster alive for its in-process client

	mu       sync.Mutex
	children map[io.Closer]struct{} // tables, KV workers and groups, closed with it
	layouts  map[string]layout      // parameters' types and shapes, as info found them
}

// layout is a parameter's element type and shape, which never change (the
// first init of a name wins).
type layout struct {
	dtype DType
	shape []int64
}

// NewClient is a client of opts.Servers (connections are made lazily: an
// unreachable server shows up as UNAVAILABLE or DEADLINE_EXCEEDED on the
// first call). INVALID_ARGUMENT for no servers or an empty address.
//
// With opts.Etcd it finds the servers in etcd instead, waiting for them
// until ctx's deadline (60 s without one); DEADLINE_EXCEEDED names the
// missing indexes.
//
//	client, err := pserver.NewClient(ctx, pserver.Options{Etcd: "127.0.0.1:2379", Cluster: "default"})
func NewClient(ctx context.Context, opts Options) (*Client, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("pserver: new client: %w", contextError(err))
	}
	copts, err := opts.toC()
	if err != nil {
		return nil, fmt.Errorf("pserver: new client: %w", err)
	}
	defer C.pserver_client_options_delete(copts)
	if len(opts.Servers) > 0 && opts.Etcd != "" {
		return nil, fmt.Errorf("pserver: new client: %w", invalidArgument("Servers or Etcd, not both"))
	}
	if deadline, ok := ctx.Deadline(); ok && opts.Etcd != "" {
		ms := time.Until(deadline).Milliseconds()
		if ms < 1 {
			ms = 1
		}
		C.pserver_client_options_set_discovery_timeout_ms(copts, C.int64_t(ms))
	}
	var c *C.pserver_client_t
	if err := cCall(func(st *C.pserver_status_t) { c = C.pserver_client_new(copts, st) }); err != nil {
		return nil, fmt.Errorf("pserver: new client: %w", err)
	}
	servers := opts.Servers
	if opts.Etcd != "" {
		servers = nil
		buf := make([]byte, 256)
		for i := 0; i < int(C.pserver_client_num_servers(c)); i++ {
			n := C.pserver_client_server_address(c, C.int32_t(i), (*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)))
			if int(n) >= len(buf) {
				n = C.size_t(len(buf) - 1)
			}
			servers = append(servers, string(buf[:n]))
		}
	}
	return wrapClient(c, servers, nil), nil
}

func wrapClient(c *C.pserver_client_t, servers []string, owner interface{}) *Client {
	cl := &Client{c: c, servers: append([]string(nil), servers...), owner: owner}
	runtime.SetFinalizer(cl, func(cl *Client) { cl.Close() })
	return cl
}

// Close closes the tables, KV workers (which leave their tables) and groups
// made from the client, waits for the calls in flight, then frees the
// client. It is safe to call twice; afterwards every method returns
// ErrClosed.
func (cl *Client) Close() error {
	cl.mu.Lock()
	children := make([]io.Closer, 0, len(cl.children))
	for c := range cl.children {
		children = append(children, c)
	}
	cl.mu.Unlock()
	for _, c := range children {
		c.Close()
	}
	if cl.life.close(func() { C.pserver_client_delete(cl.c); cl.c = nil }) {
		runtime.SetFinalizer(cl, nil)
	}
	return nil
}

// Servers is the addresses the client was made with, or found in etcd when
// it was made (empty for a LocalCluster's in-process client).
func (cl *Client) Servers() []string { return append([]string(nil), cl.servers...) }

// NumServers is the number of servers (shards); 0 after Close.
func (cl *Client) NumServers() int {
	if cl.life.begin() != nil {
		return 0
	}
	defer cl.life.end()
	return int(C.pserver_client_num_servers(cl.c))
}

// run calls f on the client with a fresh status, honouring ctx (see
// Client). after(err) and then free run once f has returned, before run
// returns.
func (cl *Client) run(ctx context.Context, f func(c *C.pserver_client_t, st *C.pserver_status_t), after func(error), free func()) error {
	return runCall(ctx, []*lifecycle{&cl.life}, func(st *C.pserver_status_t) { f(cl.c, st) }, after, free)
}

// runCall calls f with a fresh status while every handle of lives is
// registered as in use, honouring ctx as Client says: ctx's deadline is the
// call's timeout, and ctx ending cancels the library call itself
// (pserver_cancel_t), which then ends promptly; runCall returns once it has,
// with ctx's error unless the call succeeded first. Nothing is left running.
// after(err) and then free run once f has returned, before runCall returns.
func runCall(ctx context.Context, lives []*lifecycle, f func(st *C.pserver_status_t), after func(error), free func()) error {
	if err := ctx.Err(); err != nil {
		free()
		return contextError(err)
	}
	for i, l := range lives {
		if err := l.begin(); err != nil {
			for _, done := range lives[:i] {
				done.end()
			}
			free()
			return err
		}
	}
	err := func() error {
		defer func() {
			for _, l := range lives {
				l.end()
			}
		}()
		var cancel *C.pserver_cancel_t
		if ctx.Done() != nil {
			cancel = C.pserver_cancel_new()
			stop := watchCancel(ctx, cancel)
			defer func() {
				stop()
				C.pserver_cancel_delete(cancel)
			}()
		}
		err := cCall(func(st *C.pserver_status_t) {
			setTimeout(ctx, st)
			C.pserver_status_set_cancel(st, cancel)
			f(st)
		})
		if e, ok := err.(*Error); ok && e.Code == Canceled && ctx.Err() != nil {
			return contextError(ctx.Err()) // this call's cancel: ctx ended
		}
		return withDeadlineCause(ctx, err)
	}()
	after(err)
	free()
	return err
}

// watchCancel cancels `cancel` when ctx ends, until stop is called; stop
// returns once the watcher is gone, so cancel may then be deleted.
func watchCancel(ctx context.Context, cancel *C.pserver_cancel_t) (stop func()) {
	callDone := make(chan struct{})
	watcherDone := make(chan struct{})
	go func() {
		defer close(watcherDone)
		select {
		case <-ctx.Done():
			C.pserver_cancel_cancel(cancel)
		case <-callDone:
		}
	}()
	return func() {
		close(callDone)
		<-watcherDone
	}
}

// setTimeout gives the call st is passed to ctx's deadline as its timeout
// (pserver_status_set_timeout_ms), so the library call ends by then too.
// Rounded up to whole milliseconds: the call never ends before ctx does.
func setTimeout(ctx context.Context, st *C.pserver_status_t) {
	deadline, ok := ctx.Deadline()
	if !ok {
		return
	}
	ms := int64((time.Until(deadline) + time.Millisecond - 1) / time.Millisecond)
	if ms < 1 {
		ms = 1 // already past: fails at once with DEADLINE_EXCEEDED
	}
	C.pserver_status_set_timeout_ms(st, C.int64_t(ms))
}

// withDeadlineCause makes a library DEADLINE_EXCEEDED that came once ctx's
// deadline had passed (the deadline setTimeout passed down) match
// context.DeadlineExceeded too, as when ctx ends first.
func withDeadlineCause(ctx context.Context, err error) error {
	e, ok := err.(*Error)
	if !ok || e.Code != DeadlineExceeded || e.cause != nil {
		return err
	}
	if deadline, ok := ctx.Deadline(); ok && !time.Now().Before(deadline) {
		e.cause = context.DeadlineExceeded
	}
	return err
}

func nop()         {}
func nopErr(error) {}

// Init initializes parameter name from value (its type, shape and
// elements); cfg may be nil (plain SGD). The first init of a name wins;
// later ones fail with ErrAlreadyInitialized.
func (cl *Client) Init(ctx context.Context, name string, value *Tensor, cfg *ParamConfig) error {
	var ccfg *C.pserver_param_config_t
	if cfg != nil {
		var err error
		if ccfg, err = cfg.toC(); err != nil {
			return fmt.Errorf("pserver: init %q: %w", name, err)
		}
	}
	cname := C.CString(name)
	data, size := value.cMem()
	shape, freeShape := cShape(value.shape)
	free := func() {
		C.free(unsafe.Pointer(cname))
		runtime.KeepAlive(value)
		freeShape()
		C.pserver_param_config_delete(ccfg)
	}
	err := cl.run(ctx, func(c *C.pserver_client_t, st *C.pserver_status_t) {
		C.pserver_client_init_param(c, cname, C.size_t(len(name)), C.int32_t(value.dtype), shape, C.size_t(len(value.shape)),
			data, size, ccfg, st)
	}, nopErr, free)
	if err != nil {
		return fmt.Errorf("pserver: init %q: %w", name, err)
	}
	return nil
}

// FinishInit opens every server for reads and gradients; idempotent.
func (cl *Client) FinishInit(ctx context.Context) error {
	err := cl.run(ctx, func(c *C.pserver_client_t, st *C.pserver_status_t) {
		C.pserver_client_finish_init(c, st)
	}, nopErr, nop)
	if err != nil {
		return fmt.Errorf("pserver: finish init: %w", err)
	}
	return nil
}

// Info is a parameter's element type and shape. ErrNotFound for an
// unknown name.
func (cl *Client) Info(ctx context.Context, name string) (DType, []int64, error) {
	dtype, shape, err := cl.info(ctx, name)
	if err != nil {
		return 0, nil, fmt.Errorf("pserver: info %q: %w", name, err)
	}
	return dtype, shape, nil
}

func (cl *Client) info(ctx context.Context, name string) (DType, []int64, error) {
	var (
		dtype DType
		shape []int64
		ierr  error
	)
	var (
		d DType
		s []int64
	)
	cname := C.CString(name)
	err := cl.run(ctx, func(c *C.pserver_client_t, st *C.pserver_status_t) {
		d, s, ierr = paramInfo(func(d *C.int32_t, s *C.int64_t, capacity C.size_t, n *C.size_t, st2 *C.pserver_status_t) {
			C.pserver_status_set_timeout_ms(st2, C.pserver_status_timeout_ms(st))
			C.pserver_client_param_info(c, cname, C.size_t(len(name)), d, s, capacity, n, st2)
		})
		if ierr != nil {
			e := ierr.(*Error)
			cst := C.CString(e.Msg)
			C.pserver_status_set(st, C.int32_t(e.Code), cst)
			C.free(unsafe.Pointer(cst))
		}
	}, func(err error) { dtype, shape = d, s }, func() { C.free(unsafe.Pointer(cname)) })
	return dtype, shape, err
}

// layout is info(name), asked of the library once per name, so that Get is
// one library call.
func (cl *Client) layout(ctx context.Context, name string) (DType, []int64, error) {
	cl.mu.Lock()
	l, ok := cl.layouts[name]
	cl.mu.Unlock()
	if ok {
		return l.dtype, l.shape, nil
	}
	dtype, shape, err := cl.info(ctx, name)
	if err != nil {
		return 0, nil, err
	}
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.layouts == nil {
		cl.layouts = make(map[string]layout)
	}
	cl.layouts[name] = layout{dtype, shape}
	return dtype, shape, nil
}

// Get reads a parameter into a new tensor of its type and shape.
func (cl *Client) Get(ctx context.Context, name string) (*Tensor, error) {
	dtype, shape, err := cl.layout(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("pserver: get %q: %w", name, err)
	}
	out, err := newTensor(dtype, shape)
	if err != nil {
		return nil, fmt.Errorf("pserver: get %q: %w", name, err)
	}
	if err := cl.GetInto(ctx, name, out); err != nil {
		return nil, err
	}
	return out, nil
}

// GetInto reads a parameter into out, which must have its type and number
// of elements (INVALID_ARGUMENT otherwise, naming what was expected). The
// library writes straight into out: a call refused before anything is sent
// (a wrong type or size, a ctx already ended) leaves it untouched, but one
// that fails after sending may leave it partly written.
func (cl *Client) GetInto(ctx context.Context, name string, out *Tensor) error {
	cname := C.CString(name)
	p, size := out.cMem() // written in place by the library
	err := cl.run(ctx, func(c *C.pserver_client_t, st *C.pserver_status_t) {
		C.pserver_client_get_param(c, cname, C.size_t(len(name)), C.int32_t(out.dtype), p, size, st)
	}, nopErr, func() { C.free(unsafe.Pointer(cname)); runtime.KeepAlive(out) })
	if err != nil {
		return fmt.Errorf("pserver: get %q: %w", name, err)
	}
	return nil
}

// GetMany reads several parameters in one round trip per server.
func (cl *Client) GetMany(ctx context.Context, names []string) (map[string]*Tensor, error) {
	outs := make(map[string]*Tensor, len(names))
	for _, name := range names {
		dtype, shape, err := cl.layout(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("pserver: get %q: %w", name, err)
		}
		if outs[name], err = newTensor(dtype, shape); err != nil {
			return nil, fmt.Errorf("pserver: get %q: %w", name, err)
		}
	}
	b := newBatch()
	for _, name := range names {
		b.addOutput(name, outs[name])
	}
	err := cl.run(ctx, func(c *C.pserver_client_t, st *C.pserver_status_t) {
		C.pserver_client_get_params(c, b.outs, st)
	}, func(err error) {
		if err == nil {
			b.copyOut()
		}
	}, b.free)
	if err != nil {
		return nil, fmt.Errorf("pserver: get %q: %w", names, err)
	}
	return outs, nil
}

// SendGrad sends a gradient for a parameter: as many elements as it has,
// of its type.
func (cl *Client) SendGrad(ctx context.Context, name string, grad *Tensor) error {
	cname := C.CString(name)
	data, size := grad.cMem()
	err := cl.run(ctx, func(c *C.pserver_client_t, st *C.pserver_status_t) {
		C.pserver_client_send_grad(c, cname, C.size_t(len(name)), C.int32_t(grad.dtype), data, size, st)
	}, nopErr, func() { C.free(unsafe.Pointer(cname)); runtime.KeepAlive(grad) })
	if err != nil {
		return fmt.Errorf("pserver: send grad %q: %w", name, err)
	}
	return nil
}

// SendGrads sends several gradients; a batch with any bad part is applied
// not at all.
func (cl *Client) SendGrads(ctx context.Context, grads map[string]*Tensor) error {
	names := sortedNames(grads)
	b := newBatch()
	for _, name := range names {
		b.addInput(name, grads[name])
	}
	err := cl.run(ctx, func(c *C.pserver_client_t, st *C.pserver_status_t) {
		C.pserver_client_send_grads(c, b.ins, st)
	}, nopErr, b.free)
	if err != nil {
		return fmt.Errorf("pserver: send grads %q: %w", names, err)
	}
	return nil
}

// PushPull sends gradients and reads the updated parameters back, one round
// trip per server. The results have the gradients' types and shapes.
func (cl *Client) PushPull(ctx context.Context, grads map[string]*Tensor) (map[string]*Tensor, error) {
	outs := make(map[string]*Tensor, len(grads))
	for name, g := range grads {
		out, err := newTensor(g.dtype, g.shape)
		if err != nil {
			return nil, fmt.Errorf("pserver: push pull %q: %w", name, err)
		}
		outs[name] = out
	}
	if err := cl.PushPullInto(ctx, grads, outs); err != nil {
		return nil, err
	}
	return outs, nil
}

// PushPullInto is PushPull into tensors the caller keeps: outs[name], for
// each name of grads, receives the parameter after its update and must
// have the gradient's type and number of elements (INVALID_ARGUMENT
// otherwise, before anything is sent). One gradient goes through one
// library call over the tensors' own memory; a batch of several is copied
// through C memory, as cgo forbids C memory holding Go pointers.
func (cl *Client) PushPullInto(ctx context.Context, grads, outs map[string]*Tensor) error {
	names := sortedNames(grads)
	for _, name := range names {
		if outs[name] == nil {
			return fmt.Errorf("pserver: push pull %q: %w", names,
				invalidArgument("no output tensor for %q", name))
		}
	}
	var err error
	if len(names) == 1 {
		err = cl.pushPullOne(ctx, names[0], grads[names[0]], outs[names[0]])
	} else {
		err = cl.pushPullBatch(ctx, names, grads, outs)
	}
	if err != nil {
		return fmt.Errorf("pserver: push pull %q: %w", names, err)
	}
	return nil
}

// pushPullOne pushes grad and pulls the result into out: one library call.
func (cl *Client) pushPullOne(ctx context.Context, name string, grad, out *Tensor) error {
	cname := C.CString(name)
	data, size := grad.cMem()
	p, outSize := out.cMem() // written in place by the library
	return cl.run(ctx, func(c *C.pserver_client_t, st *C.pserver_status_t) {
		C.pserver_client_push_pull_one(c, cname, C.size_t(len(name)), C.int32_t(grad.dtype), data, size, p, outSize, st)
	}, nopErr, func() { C.free(unsafe.Pointer(cname)); runtime.KeepAlive(grad); runtime.KeepAlive(out) })
}

// pushPullBatch is one library call over C copies of the tensors.
func (cl *Client) pushPullBatch(ctx context.Context, names []string, grads, outs map[string]*Tensor) error {
	b := newBatch()
	for _, name := range names {
		b.addInput(name, grads[name])
		b.addOutput(name, outs[name])
	}
	return cl.run(ctx, func(c *C.pserver_client_t, st *C.pserver_status_t) {
		C.pserver_client_push_pull(c, b.ins, b.outs, st)
	}, func(err error) {
		if err == nil {
			b.copyOut()
		}
	}, b.free)
}

// SaveCheckpoint asks every server to write a checkpoint of its shard now.
// FAILED_PRECONDITION from a server without a checkpoint directory.
func (cl *Client) SaveCheckpoint(ctx context.Context) error {
	err := cl.run(ctx, func(c *C.pserver_client_t, st *C.pserver_status_t) {
		C.pserver_client_save_checkpoint(c, st)
	}, nopErr, nop)
	if err != nil {
		return fmt.Errorf("pserver: save checkpoint: %w", err)
	}
	return nil
}

// ServerStats is what one server reports.
type ServerStats struct {
	Index               uint32
	Initialized         bool // FinishInit has been called
	Parameters          uint64
	ParameterBytes      uint64
	OptimizerStateBytes uint64
	GradientsApplied    uint64
	GetsServed          uint64
	RequestsRejected    uint64
	Uptime              time.Duration
	// Bulk-channel connections since the server started that use the AEAD
	// layer after TLS (see TLS.DisableBulkAEAD).
	BulkAEADConnections uint64
}

// healthNames are PSERVER_HEALTH_* (grpc.health.v1 ServingStatus) by value.
var healthNames = map[C.int32_t]string{
	C.PSERVER_HEALTH_UNKNOWN:         "UNKNOWN",
	C.PSERVER_HEALTH_SERVING:         "SERVING",
	C.PSERVER_HEALTH_NOT_SERVING:     "NOT_SERVING",
	C.PSERVER_HEALTH_SERVICE_UNKNOWN: "SERVICE_UNKNOWN",
}

// Health is every server's gRPC health (grpc.health.v1), in index order:
// "SERVING" once registered, loaded and serving, "NOT_SERVING" while starting
// or draining. An unreachable server fails the call.
func (cl *Client) Health(ctx context.Context) ([]string, error) {
	const capacity = 1024
	buf := cAlloc(4 * capacity)
	var n C.size_t
	var health []string
	err := cl.run(ctx, func(c *C.pserver_client_t, st *C.pserver_status_t) {
		n = C.pserver_client_health(c, (*C.int32_t)(buf.p), capacity, st)
	}, func(err error) {
		if err != nil {
			return
		}
		for i := 0; i < int(n) && i < capacity; i++ {
			code := *(*C.int32_t)(unsafe.Add(buf.p, 4*i))
			name, ok := healthNames[code]
			if !ok {
				name = "UNKNOWN"
			}
			health = append(health, name)
		}
	}, buf.free)
	if err != nil {
		return nil, fmt.Errorf("pserver: health: %w", err)
	}
	return health, nil
}

// ParamListing is one parameter of the cluster as the live servers list it.
type ParamListing struct {
	Name       string
	DType      DType
	Shape      []int64
	BlocksHeld uint32 // over all servers
	BlockCount uint32 // blocks it is split into
	Optimizer  string // "sgd", "adam", ...
}

// ListParams is every parameter of the cluster, in name order, each once
// (pserver_client_list_params: each server is read a page of at most 1000
// names at a time).
func (cl *Client) ListParams(ctx context.Context) ([]ParamListing, error) {
	var list *C.pserver_param_list_t
	var out []ParamListing
	var listErr error
	err := cl.run(ctx, func(c *C.pserver_client_t, st *C.pserver_status_t) {
		list = C.pserver_client_list_params(c, st)
	}, func(err error) {
		if err != nil || list == nil {
			return
		}
		out, listErr = paramListings(list)
	}, func() { C.pserver_param_list_delete(list) })
	if err == nil {
		err = listErr
	}
	return out, err
}

func paramListings(list *C.pserver_param_list_t) ([]ParamListing, error) {
	n := int(C.pserver_param_list_size(list))
	out := make([]ParamListing, 0, n)
	for i := C.size_t(0); i < C.size_t(n); i++ {
		var nameLen C.size_t
		name := C.pserver_param_list_name(list, i, &nameLen)
		p := ParamListing{Name: C.GoStringN(name, C.int(nameLen))}
		var err error
		p.DType, p.Shape, err = paramInfo(func(d *C.int32_t, s *C.int64_t, capacity C.size_t, nd *C.size_t, st *C.pserver_status_t) {
			C.pserver_param_list_info(list, i, d, s, capacity, nd, nil, nil, nil, st)
		})
		if err != nil {
			return nil, err
		}
		var held, count C.uint32_t
		var optimizer *C.char
		if err := cCall(func(st *C.pserver_status_t) {
			C.pserver_param_list_info(list, i, nil, nil, 0, nil, &held, &count, &optimizer, st)
		}); err != nil {
			return nil, err
		}
		p.BlocksHeld, p.BlockCount, p.Optimizer = uint32(held), uint32(count), C.GoString(optimizer)
		out = append(out, p)
	}
	return out, nil
}

// Stats is every server's stats, in index order.
func (cl *Client) Stats(ctx context.Context) ([]ServerStats, error) {
	const capacity = 1024
	size := C.size_t(unsafe.Sizeof(C.pserver_server_stats_t{}))
	buf := cAlloc(int(size) * capacity)
	var n C.size_t
	var stats []ServerStats
	err := cl.run(ctx, func(c *C.pserver_client_t, st *C.pserver_status_t) {
		n = C.pserver_client_stats(c, (*C.pserver_server_stats_t)(buf.p), capacity, size, st)
	}, func(err error) {
		if err != nil {
			return
		}
		for i := 0; i < int(n) && i < capacity; i++ {
			s := (*C.pserver_server_stats_t)(unsafe.Add(buf.p, i*int(size)))
			stats = append(stats, ServerStats{
				Index:               uint32(s.index),
				Initialized:         s.initialized != 0,
				Parameters:          uint64(s.parameters),
				ParameterBytes:      uint64(s.parameter_bytes),
				OptimizerStateBytes: uint64(s.optimizer_state_bytes),
				GradientsApplied:    uint64(s.gradients_applied),
				GetsServed:          uint64(s.gets_served),
				RequestsRejected:    uint64(s.requests_rejected),
				Uptime:              time.Duration(float64(s.uptime_seconds) * float64(time.Second)),
				BulkAEADConnections: uint64(s.bulk_aead_connections),
			})
		}
	}, buf.free)
	if err != nil {
		return nil, fmt.Errorf("pserver: stats: %w", err)
	}
	return stats, nil
}

func sortedNames(m map[string]*Tensor) []string {
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	sort.Strings(names)
	return names
}

// batch is a pserver_batch_t of inputs and one of outputs over C copies.
type batch struct {
	ins, outs *C.pserver_batch_t
	cstrs     []*C.char
	bufs      []cBuf
	outBufs   []cBuf
	outT      []*Tensor
}

func newBatch() *batch {
	return &batch{ins: C.pserver_batch_new(), outs: C.pserver_batch_new()}
}

func (b *batch) cstr(s string) *C.char {
	c := C.CString(s)
	b.cstrs = append(b.cstrs, c)
	return c
}

func (b *batch) addInput(name string, t *Tensor) {
	buf := cCopy(t)
	b.bufs = append(b.bufs, buf)
	C.pserver_batch_add_input(b.ins, b.cstr(name), C.size_t(len(name)), C.int32_t(t.dtype), buf.p, buf.size())
}

func (b *batch) addOutput(name string, t *Tensor) {
	_, n := t.mem()
	buf := cAlloc(n)
	b.bufs = append(b.bufs, buf)
	b.outBufs = append(b.outBufs, buf)
	b.outT = append(b.outT, t)
	C.pserver_batch_add_output(b.outs, b.cstr(name), C.size_t(len(name)), C.int32_t(t.dtype), buf.p, buf.size())
}

func (b *batch) copyOut() {
	for i, buf := range b.outBufs {
		buf.copyTo(b.outT[i])
	}
}

func (b *batch) free() {
	C.pserver_batch_delete(b.ins)
	C.pserver_batch_delete(b.outs)
	for _, c := range b.cstrs {
		C.free(unsafe.Pointer(c))
	}
	for _, buf := range b.bufs {
		buf.free()
	}
}

// adopt makes Close close c (a Table, KvWorker or Group) first.
func (cl *Client) adopt(c io.Closer) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.children == nil {
		cl.children = make(map[io.Closer]struct{})
	}
	cl.children[c] = struct{}{}
}

// disown forgets c once it was closed.
func (cl *Client) disown(c io.Closer) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	delete(cl.children, c)
}
