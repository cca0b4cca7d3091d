package main

import (
	"context"
	"strings"
	"time"

	"github.com/pserver-project/pserver/go/pserver"
)

// etcd is psctl's view of etcd: the C ABI's etcd client (pserver.Etcd), the
// one etcd client pserver has, so psctl itself needs only the standard
// library.
type etcd struct{ c *pserver.Etcd }

// newEtcd is a client of endpoints; each call is bounded by timeout.
func newEtcd(endpoints []string, timeout time.Duration) (*etcd, error) {
	return newEtcdTLS(endpoints, timeout, nil)
}

// newEtcdTLS is newEtcd over TLS with a client certificate (tls nil:
// plaintext).
func newEtcdTLS(endpoints []string, timeout time.Duration, tls *pserver.EtcdTLS) (*etcd, error) {
	var c *pserver.Etcd
	var err error
	if tls != nil {
		c, err = pserver.NewEtcdTLS(strings.Join(endpoints, ","), timeout, *tls)
	} else {
		c, err = pserver.NewEtcd(strings.Join(endpoints, ","), timeout)
	}
	if err != nil {
		return nil, err
	}
	return &etcd{c: c}, nil
}

func (e *etcd) Close() error { return e.c.Close() }

type kv struct{ key, value string }

// rangePrefix is every key under prefix, sorted by key.
func (e *etcd) rangePrefix(ctx context.Context, prefix string) ([]kv, error) {
	kvs, err := e.c.GetPrefix(ctx, prefix)
	if err != nil {
		return nil, err
	}
	out := make([]kv, 0, len(kvs))
	for _, k := range kvs {
		out = append(out, kv{k.Key, string(k.Value)})
	}
	return out, nil
}

func (e *etcd) put(ctx context.Context, key, value string) error {
	return e.c.Put(ctx, key, []byte(value))
}
