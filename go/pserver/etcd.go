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

// Etcd is a small etcd v3 client for tools (psctl), over the C ABI's
// pserver_etcd_* calls: full keys such as "/pserver/default/ps_desired"
// (layout in docs/operations.md). Safe for concurrent use.
//
// Each call is bounded by the timeout given to NewEtcd; a ctx that is
// already done fails the call at once.
type Etcd struct {
	e    *C.pserver_etcd_t
	life lifecycle
}

// KeyValue is one etcd key and its value.
type KeyValue struct {
	Key   string
	Value []byte
}

// NewEtcd makes a client of endpoints "host:port[,host:port...]"; every
// call has the given timeout (> 0). It does not wait for etcd.
func NewEtcd(endpoints string, timeout time.Duration) (*Etcd, error) {
	ms := timeout.Milliseconds()
	if timeout > 0 && ms == 0 {
		ms = 1
	}
	ce := C.CString(endpoints)
	defer C.free(unsafe.Pointer(ce))
	var e *C.pserver_etcd_t
	if err := cCall(func(st *C.pserver_status_t) { e = C.pserver_etcd_new(ce, C.int64_t(ms), st) }); err != nil {
		return nil, fmt.Errorf("pserver: new etcd client: %w", err)
	}
	et := &Etcd{e: e}
	runtime.SetFinalizer(et, func(et *Etcd) { et.Close() })
	return et, nil
}

// Close waits for calls in flight and frees the client; safe to call twice.
func (et *Etcd) Close() error {
	if et.life.close(func() { C.pserver_etcd_delete(et.e); et.e = nil }) {
		runtime.SetFinalizer(et, nil)
	}
	return nil
}

func (et *Etcd) call(ctx context.Context, f func(e *C.pserver_etcd_t, st *C.pserver_status_t)) error {
	if err := ctx.Err(); err != nil {
		return contextError(err)
	}
	if err := et.life.begin(); err != nil {
		return err
	}
	defer et.life.end()
	return cCall(func(st *C.pserver_status_t) { f(et.e, st) })
}

// Get is the value of key; an error matching ErrNotFound when it is absent.
func (et *Etcd) Get(ctx context.Context, key string) ([]byte, error) {
	ck := C.CString(key)
	defer C.free(unsafe.Pointer(ck))
	var value []byte
	err := et.call(ctx, func(e *C.pserver_etcd_t, st *C.pserver_status_t) {
		var buf *C.char
		var size C.size_t
		C.pserver_etcd_get(e, ck, &buf, &size, st)
		if buf != nil {
			value = C.GoBytes(unsafe.Pointer(buf), C.int(size))
			C.pserver_buffer_delete(unsafe.Pointer(buf))
		}
	})
	if err != nil {
		return nil, fmt.Errorf("pserver: etcd get %q: %w", key, err)
	}
	return value, nil
}

// GetPrefix is every key that starts with prefix, sorted by key.
func (et *Etcd) GetPrefix(ctx context.Context, prefix string) ([]KeyValue, error) {
	cp := C.CString(prefix)
	defer C.free(unsafe.Pointer(cp))
	var out []KeyValue
	err := et.call(ctx, func(e *C.pserver_etcd_t, st *C.pserver_status_t) {
		kvs := C.pserver_etcd_get_prefix(e, cp, st)
		if kvs == nil {
			return
		}
		defer C.pserver_etcd_kvs_delete(kvs)
		n := int(C.pserver_etcd_kvs_size(kvs))
		out = make([]KeyValue, 0, n)
		for i := 0; i < n; i++ {
			ci := C.size_t(i)
			out = append(out, KeyValue{
				Key:   C.GoString(C.pserver_etcd_kvs_key(kvs, ci)),
				Value: C.GoBytes(unsafe.Pointer(C.pserver_etcd_kvs_value(kvs, ci)), C.int(C.pserver_etcd_kvs_value_size(kvs, ci))),
			})
		}
	})
	if err != nil {
		return nil, fmt.Errorf("pserver: etcd get prefix %q: %w", prefix, err)
	}
	return out, nil
}

// Put sets key to value.
func (et *Etcd) Put(ctx context.Context, key string, value []byte) error {
	ck := C.CString(key)
	defer C.free(unsafe.Pointer(ck))
	var cv unsafe.Pointer
	if len(value) > 0 {
		cv = C.CBytes(value)
		defer C.free(cv)
	}
	err := et.call(ctx, func(e *C.pserver_etcd_t, st *C.pserver_status_t) {
		C.pserver_etcd_put(e, ck, cv, C.size_t(len(value)), st)
	})
	if err != nil {
		return fmt.Errorf("pserver: etcd put %q: %w", key, err)
	}
	return nil
}

// Delete removes key; a key that does not exist is not an error.
func (et *Etcd) Delete(ctx context.Context, key string) error {
	ck := C.CString(key)
	defer C.free(unsafe.Pointer(ck))
	err := et.call(ctx, func(e *C.pserver_etcd_t, st *C.pserver_status_t) { C.pserver_etcd_delete_key(e, ck, st) })
	if err != nil {
		return fmt.Errorf("pserver: etcd delete %q: %w", key, err)
	}
	return nil
}
