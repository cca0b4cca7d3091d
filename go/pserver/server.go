package pserver

// #include <stdlib.h>
// #include "pserver.h"
import "C"

import (
	"context"
	"fmt"
	"runtime"
	"time"
	"unsafe"
)

// ServerOptions configure an embedded Server (and each server of a
// LocalCluster). The zero value: 127.0.0.1, a free port, index 0, two
// request threads per core, no checkpoints.
type ServerOptions struct {
	Host string
	// AdvertiseHost: the address others reach the server at (pserver
	// --advertise_host); needed when Host is 0.0.0.0 or ::. Address() is then
	// AdvertiseHost:port ([addr]:port for IPv6).
	AdvertiseHost string
	Port          int
	Index         uint32
	NumThreads    int
	// CheckpointDir: shard i is kept in <dir>/shard-<i>; the server loads
	// its shard's newest good checkpoint on start and saves one on
	// SaveCheckpoint and when it stops.
	CheckpointDir string
	// TLS: mutual TLS only (nil: plaintext).
	TLS *TLS
	// Roles (docs/security.md): the server's Job, with AuthTokensFile
	// (lines "role job token") and/or AuthCertRule ("cn:<role>.<job>").
	Job, AuthTokensFile, AuthCertRule string
	// Etcd ("host:port[,host:port...]"): register in etcd as pserver --etcd
	// does, under /pserver/<Cluster> ("default"), claiming the lowest free
	// index below NumServers (written to /ps_desired if absent; 0: what etcd
	// holds) and publishing address and instance id at /ps/<idx>. NewServer
	// waits up to 60 s for etcd and a free index. EtcdTLS: etcd over TLS
	// with this server's client certificate. NewServer only: a LocalCluster
	// does not register.
	Etcd       string
	Cluster    string
	NumServers uint32
	EtcdTLS    *EtcdTLS
}

func (o *ServerOptions) toC() *C.pserver_server_options_t {
	opts := C.pserver_server_options_new()
	if o == nil {
		return opts
	}
	if o.Host != "" {
		c := C.CString(o.Host)
		C.pserver_server_options_set_host(opts, c)
		C.free(unsafe.Pointer(c))
	}
	if o.AdvertiseHost != "" {
		c := C.CString(o.AdvertiseHost)
		C.pserver_server_options_set_advertise_host(opts, c)
		C.free(unsafe.Pointer(c))
	}
	C.pserver_server_options_set_port(opts, C.int32_t(o.Port))
	C.pserver_server_options_set_index(opts, C.uint32_t(o.Index))
	C.pserver_server_options_set_num_threads(opts, C.int32_t(o.NumThreads))
	if o.CheckpointDir != "" {
		c := C.CString(o.CheckpointDir)
		C.pserver_server_options_set_checkpoint_dir(opts, c)
		C.free(unsafe.Pointer(c))
	}
	o.setAuth(opts)
	return opts
}

// Server is a gRPC pserver running in this process. Safe for concurrent use.
type Server struct {
	s    *C.pserver_server_t
	life lifecycle
	addr string
	port int
}

// NewServer starts a server (opts may be nil: the defaults).
// INVALID_ARGUMENT for a bad port or thread count, UNAVAILABLE when the
// address cannot be bound.
func NewServer(opts *ServerOptions) (*Server, error) {
	copts := opts.toC()
	defer C.pserver_server_options_delete(copts)
	if opts != nil {
		if err := opts.TLS.applyToServer(copts); err != nil {
			return nil, err
		}
		if err := opts.setEtcd(copts); err != nil {
			return nil, fmt.Errorf("pserver: server etcd: %w", err)
		}
	}
	var s *C.pserver_server_t
	if err := cCall(func(st *C.pserver_status_t) { s = C.pserver_server_new(copts, st) }); err != nil {
		return nil, fmt.Errorf("pserver: new server: %w", err)
	}
	srv := &Server{s: s, addr: C.GoString(C.pserver_server_address(s)), port: int(C.pserver_server_port(s))}
	runtime.SetFinalizer(srv, func(srv *Server) { srv.Close() })
	return srv, nil
}

// Address is "127.0.0.1:40123": where the server listens.
func (s *Server) Address() string { return s.addr }

// Port is the port the server listens on.
func (s *Server) Port() int { return s.port }

// Client is a gRPC client of this server; opts.Servers is replaced.
func (s *Server) Client(ctx context.Context, opts Options) (*Client, error) {
	opts.Servers = []string{s.addr}
	return NewClient(ctx, opts)
}

// SaveCheckpoint writes a checkpoint of the server's shard now.
// FAILED_PRECONDITION without a checkpoint directory.
func (s *Server) SaveCheckpoint(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("pserver: save checkpoint: %w", contextError(err))
	}
	if err := s.life.begin(); err != nil {
		return fmt.Errorf("pserver: save checkpoint: %w", err)
	}
	defer s.life.end()
	if err := cCall(func(st *C.pserver_status_t) { C.pserver_server_save_checkpoint(s.s, st) }); err != nil {
		return fmt.Errorf("pserver: save checkpoint: %w", err)
	}
	return nil
}

// Stop stops accepting calls, lets calls in flight finish for up to grace,
// then cancels the rest. Idempotent; Close still frees the server.
func (s *Server) Stop(grace time.Duration) {
	if s.life.begin() != nil {
		return
	}
	defer s.life.end()
	C.pserver_server_stop(s.s, C.int64_t(grace.Milliseconds()))
}

// Close stops the server and frees it; safe to call twice.
func (s *Server) Close() error {
	if s.life.close(func() { C.pserver_server_delete(s.s); s.s = nil }) {
		runtime.SetFinalizer(s, nil)
	}
	return nil
}

// LocalCluster is n servers in this process on 127.0.0.1 free ports: the
// embedded cluster for examples and tests. Safe for concurrent use.
type LocalCluster struct {
	c     *C.pserver_local_cluster_t
	life  lifecycle
	addrs []string
}

// NewLocalCluster starts n servers, each made from base (nil: the
// defaults) with index 0..n-1 and a free port. INVALID_ARGUMENT for n < 1.
func NewLocalCluster(n int, base *ServerOptions) (*LocalCluster, error) {
	copts := base.toC()
	defer C.pserver_server_options_delete(copts)
	var c *C.pserver_local_cluster_t
	if err := cCall(func(st *C.pserver_status_t) {
		c = C.pserver_local_cluster_new_with_options(C.int32_t(n), copts, st)
	}); err != nil {
		return nil, fmt.Errorf("pserver: new local cluster: %w", err)
	}
	lc := &LocalCluster{c: c}
	for i := 0; i < int(C.pserver_local_cluster_size(c)); i++ {
		lc.addrs = append(lc.addrs, C.GoString(C.pserver_local_cluster_address(c, C.int32_t(i))))
	}
	runtime.SetFinalizer(lc, func(lc *LocalCluster) { lc.Close() })
	return lc, nil
}

// Addresses is every server's "127.0.0.1:port", in index order.
func (lc *LocalCluster) Addresses() []string { return append([]string(nil), lc.addrs...) }

// Size is the number of servers.
func (lc *LocalCluster) Size() int { return len(lc.addrs) }

// Client is an in-process client of the cluster (no sockets); opts.Servers
// is ignored. After Stop its calls get UNAVAILABLE. For a gRPC client use
// NewClient with Addresses().
func (lc *LocalCluster) Client(ctx context.Context, opts Options) (*Client, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("pserver: local cluster client: %w", contextError(err))
	}
	if err := lc.life.begin(); err != nil {
		return nil, fmt.Errorf("pserver: local cluster client: %w", err)
	}
	defer lc.life.end()
	opts.Servers = nil
	copts, err := opts.toC()
	if err != nil {
		return nil, fmt.Errorf("pserver: local cluster client: %w", err)
	}
	defer C.pserver_client_options_delete(copts)
	var c *C.pserver_client_t
	if err := cCall(func(st *C.pserver_status_t) { c = C.pserver_local_cluster_client(lc.c, copts, st) }); err != nil {
		return nil, fmt.Errorf("pserver: local cluster client: %w", err)
	}
	return wrapClient(c, nil, lc), nil
}

// SaveCheckpoint writes a checkpoint of every server's shard now.
func (lc *LocalCluster) SaveCheckpoint(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("pserver: save checkpoint: %w", contextError(err))
	}
	if err := lc.life.begin(); err != nil {
		return fmt.Errorf("pserver: save checkpoint: %w", err)
	}
	defer lc.life.end()
	if err := cCall(func(st *C.pserver_status_t) { C.pserver_local_cluster_save_checkpoint(lc.c, st) }); err != nil {
		return fmt.Errorf("pserver: save checkpoint: %w", err)
	}
	return nil
}

// Stop stops every server; idempotent. Close still frees the cluster.
func (lc *LocalCluster) Stop() {
	if lc.life.begin() != nil {
		return
	}
	defer lc.life.end()
	C.pserver_local_cluster_stop(lc.c)
}

// Close stops the cluster and frees it; safe to call twice. Clients made by
// Client stay valid and get UNAVAILABLE.
func (lc *LocalCluster) Close() error {
	if lc.life.close(func() { C.pserver_local_cluster_delete(lc.c); lc.c = nil }) {
		runtime.SetFinalizer(lc, nil)
	}
	return nil
}
