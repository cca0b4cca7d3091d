package pserver

// #include <stdlib.h>
// #include "pserver.h"
import "C"

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
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

// EtcdKeys spells the etcd keys of one cluster exactly as the servers and
// trainers write them (the layout is defined once, in the C ABI's
// pserver_etcd_key): every key of cluster C starts with "/pserver/C/".
//
//	keys := pserver.Keys("default")
//	kvs, err := etcd.GetPrefix(ctx, keys.Prefix())
//	for _, kv := range kvs {
//		if k, err := keys.Parse(kv.Key); err == nil && k.Kind == pserver.KeyServer {
//			fmt.Println(k.Index, string(kv.Value))
//		}
//	}
type EtcdKeys struct{ cluster string }

// Keys is the key layout of cluster.
func Keys(cluster string) EtcdKeys { return EtcdKeys{cluster: cluster} }

// KeyKind is what a key of the layout names.
type KeyKind int

const (
	KeyDesired    KeyKind = C.PSERVER_ETCD_KEY_DESIRED    // the desired server count
	KeyServer     KeyKind = C.PSERVER_ETCD_KEY_SERVER     // a server's address, under its lease
	KeyCheckpoint KeyKind = C.PSERVER_ETCD_KEY_CHECKPOINT // a shard's newest good checkpoint (JSON)
	KeyWorker     KeyKind = C.PSERVER_ETCD_KEY_WORKER     // a trainer's registration (JSON)
	KeyShard      KeyKind = C.PSERVER_ETCD_KEY_SHARD      // a shard's epoch and holder (JSON, no lease)
)

// EtcdKey is a parsed key: its kind, the index of a server, checkpoint or
// shard key, the id of a worker key.
type EtcdKey struct {
	Kind     KeyKind
	Index    int
	WorkerID string
}

// Prefix is "/pserver/<cluster>/", the prefix of every key of the cluster.
func (k EtcdKeys) Prefix() string { return k.fixed(C.PSERVER_ETCD_KEY_CLUSTER) }

// Desired is the key of the desired server count.
func (k EtcdKeys) Desired() string { return k.fixed(C.PSERVER_ETCD_KEY_DESIRED) }

// Servers is the prefix of the server keys.
func (k EtcdKeys) Servers() string { return k.fixed(C.PSERVER_ETCD_KEY_SERVERS) }

// Server is server index's key.
func (k EtcdKeys) Server(index uint32) string {
	return k.fixed(C.PSERVER_ETCD_KEY_SERVER, strconv.FormatUint(uint64(index), 10))
}

// Checkpoints is the prefix of the checkpoint records.
func (k EtcdKeys) Checkpoints() string { return k.fixed(C.PSERVER_ETCD_KEY_CHECKPOINTS) }

// Checkpoint is the key of shard's newest good checkpoint record.
func (k EtcdKeys) Checkpoint(shard uint32) string {
	return k.fixed(C.PSERVER_ETCD_KEY_CHECKPOINT, strconv.FormatUint(uint64(shard), 10))
}

// Shards is the prefix of the shard configurations.
func (k EtcdKeys) Shards() string { return k.fixed(C.PSERVER_ETCD_KEY_SHARDS) }

// Shard is the key of shard's epoch and holder (docs/replication.md).
func (k EtcdKeys) Shard(shard uint32) string {
	return k.fixed(C.PSERVER_ETCD_KEY_SHARD, strconv.FormatUint(uint64(shard), 10))
}

// Workers is the prefix of the trainer registrations.
func (k EtcdKeys) Workers() string { return k.fixed(C.PSERVER_ETCD_KEY_WORKERS) }

// Worker is trainer id's registration key; ErrInvalidArgument for an empty id.
func (k EtcdKeys) Worker(id string) (string, error) {
	return k.key(C.PSERVER_ETCD_KEY_WORKER, id)
}

// Parse is the kind and argument of key, a full key of the cluster;
// ErrInvalidArgument, naming it, for a key outside the layout or the cluster.
func (k EtcdKeys) Parse(key string) (EtcdKey, error) {
	cc, ck := C.CString(k.cluster), C.CString(key)
	defer C.free(unsafe.Pointer(cc))
	defer C.free(unsafe.Pointer(ck))
	arg := make([]byte, len(key)+1)
	var kind C.int32_t
	err := cCall(func(st *C.pserver_status_t) {
		kind = C.pserver_etcd_key_parse(cc, ck, (*C.char)(unsafe.Pointer(&arg[0])), C.size_t(len(arg)), st)
	})
	if err != nil {
		return EtcdKey{}, fmt.Errorf("pserver: etcd key: %w", err)
	}
	parsed := EtcdKey{Kind: KeyKind(kind)}
	text := C.GoString((*C.char)(unsafe.Pointer(&arg[0])))
	switch parsed.Kind {
	case KeyServer, KeyCheckpoint, KeyShard:
		index, err := strconv.ParseUint(text, 10, 32)
		if err != nil {
			return EtcdKey{}, invalidArgument("pserver: etcd key %q: index %q: %v", key, text, err)
		}
		parsed.Index = int(index)
	case KeyWorker:
		parsed.WorkerID = text
	}
	return parsed, nil
}

// ServerEntry is a server's /ps/<index> value: where it listens, the
// instance id it drew at start ("" in a bare "host:port" entry) and where its
// /metrics page listens ("" without one).
type ServerEntry struct {
	Address        string
	InstanceID     string
	MetricsAddress string
}

// ParseServerValue reads a /ps/<index> value ("host:port instance=<id>",
// optionally followed by " metrics=host:port", or a bare "host:port");
// ErrInvalidArgument, naming the value and what is wrong, for any other.
func ParseServerValue(value string) (ServerEntry, error) {
	cv := C.CString(value)
	defer C.free(unsafe.Pointer(cv))
	bufs := [3][]byte{}
	for i := range bufs {
		bufs[i] = make([]byte, len(value)+1)
	}
	ptr := func(i int) *C.char { return (*C.char)(unsafe.Pointer(&bufs[i][0])) }
	size := C.size_t(len(value) + 1)
	err := cCall(func(st *C.pserver_status_t) {
		C.pserver_etcd_server_value_parse(cv, ptr(0), size, ptr(1), size, ptr(2), size, st)
	})
	if err != nil {
		return ServerEntry{}, fmt.Errorf("pserver: etcd: %w", err)
	}
	return ServerEntry{C.GoString(ptr(0)), C.GoString(ptr(1)), C.GoString(ptr(2))}, nil
}

// fixed is a key that cannot be refused (a known kind, a valid argument).
func (k EtcdKeys) fixed(kind C.int32_t, arg ...string) string {
	key, err := k.key(kind, strings.Join(arg, ""))
	if err != nil {
		panic(err) // unreachable: only out of memory fails here
	}
	return key
}

// key is the full key of kind with arg, from pserver_etcd_key.
func (k EtcdKeys) key(kind C.int32_t, arg string) (string, error) {
	cc, ca := C.CString(k.cluster), C.CString(arg)
	defer C.free(unsafe.Pointer(cc))
	defer C.free(unsafe.Pointer(ca))
	buf := make([]byte, len(k.cluster)+len(arg)+32)
	var n C.size_t
	err := cCall(func(st *C.pserver_status_t) {
		n = C.pserver_etcd_key(kind, cc, ca, (*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)), st)
	})
	if err != nil {
		return "", fmt.Errorf("pserver: etcd key: %w", err)
	}
	return string(buf[:n]), nil
}
