// Package pserver is the Go binding of pserver, a distributed parameter
// server: a client, an embedded server and local cluster, and a checkpoint
// reader, over the stable C ABI (pserver.h, libpserver.so) through cgo.
//
//	cluster, _ := pserver.NewLocalCluster(2, nil)
//	defer cluster.Close()
//	client, _ := pserver.NewClient(ctx, pserver.Options{Servers: cluster.Addresses()})
//	defer client.Close()
//	w, _ := pserver.NewTensor([]float32{0, 0, 0, 0})
//	client.Init(ctx, "w", w, &pserver.ParamConfig{Optimizer: "adam", Settings: map[string]float64{"lr": 0.1}})
//	client.FinishInit(ctx)
//	g, _ := pserver.NewTensor([]float32{1, 1, 1, 1})
//	out, _ := client.PushPull(ctx, map[string]*pserver.Tensor{"w": g})
//
// Tables (docs/tables.md): client.CreateTable gives a *Table of uint64 keys
// mapped to rows (Pull, Push, Stats, Join); a *KvWorker reads and adds at
// its clock under BSP/SSP/ASP; client.Group gives a *Group for Barrier,
// AllReduce and Broadcast through the servers.
//
// On a cluster registered in etcd, Options{Etcd: "host:port", Cluster: "name"}
// finds the servers instead of Options.Servers; Etcd is a small etcd client
// (get, get prefix, put, delete) for tools such as psctl.
//
// Errors are *Error{Code, Msg}, matched with errors.Is against ErrNotFound,
// ErrInvalidArgument, ErrAlreadyInitialized, ...; every handle has a Close
// that waits for calls in flight and may be called twice, after which
// methods return ErrClosed. C never keeps a Go pointer: data crosses into C
// as copies in C memory.
//
// Deadlines: a blocking call's ctx deadline becomes the library call's own
// timeout, so the C call ends by then (DEADLINE_EXCEEDED) and Close does not
// wait past it. A ctx that ends (cancelled, or its deadline) cancels the
// library call itself (pserver_cancel_t), which ends promptly; the method
// returns once it has, with CANCELLED (errors.Is context.Canceled) or
// DEADLINE_EXCEEDED. No library call is left running behind a method.
//
// Building: cgo finds pserver.h and libpserver.so through pkg-config
// (pserver.pc, installed by `bazel run //:install -- --prefix DIR` into
// DIR/lib/pkgconfig: set PKG_CONFIG_PATH to it when DIR is not a system
// prefix). Bazel's targets write a pserver.pc over their own build output
// (go/go_env.sh).
package pserver

// #cgo pkg-config: pserver
import "C"
