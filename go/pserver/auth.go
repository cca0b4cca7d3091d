package pserver

// #include <stdlib.h>
// #include "pserver.h"
import "C"

import (
	"fmt"
	"runtime"
	"time"
	"unsafe"
)

// EtcdTLS speaks to etcd over TLS with a client certificate (etcd
// --client-cert-auth): PEM paths of the CA that signed etcd's certificate,
// and of this client's certificate and key (docs/security.md).
type EtcdTLS struct {
	CA, Cert, Key string
}

// setAuth applies Options.Token, Options.EtcdTLS and
// Options.RequireInstanceID to opts.
func (o *Options) setAuth(opts *C.pserver_client_options_t) {
	if o.Token != "" {
		ct := C.CString(o.Token)
		C.pserver_client_options_set_token(opts, ct)
		C.free(unsafe.Pointer(ct))
	}
	o.EtcdTLS.apply(func(ca, cert, key *C.char) { C.pserver_client_options_set_etcd_tls(opts, ca, cert, key) })
	if o.RequireInstanceID {
		C.pserver_client_options_set_require_instance_id(opts, 1)
	}
}

// apply calls set with the three paths as C strings (freed after); nothing
// for a nil t.
func (t *EtcdTLS) apply(set func(ca, cert, key *C.char)) {
	if t == nil {
		return
	}
	ca, cert, key := C.CString(t.CA), C.CString(t.Cert), C.CString(t.Key)
	set(ca, cert, key)
	C.free(unsafe.Pointer(ca))
	C.free(unsafe.Pointer(cert))
	C.free(unsafe.Pointer(key))
}

// setEtcd applies ServerOptions.Etcd, Cluster, NumServers and EtcdTLS.
func (o *ServerOptions) setEtcd(opts *C.pserver_server_options_t) error {
	o.EtcdTLS.apply(func(ca, cert, key *C.char) { C.pserver_server_options_set_etcd_tls(opts, ca, cert, key) })
	if o.Etcd == "" {
		return nil
	}
	ce, cc := C.CString(o.Etcd), C.CString(o.Cluster)
	defer C.free(unsafe.Pointer(ce))
	defer C.free(unsafe.Pointer(cc))
	return cCall(func(st *C.pserver_status_t) {
		C.pserver_server_options_set_etcd(opts, ce, cc, C.uint32_t(o.NumServers), st)
	})
}

// setAuth applies the roles of o to opts.
func (o *ServerOptions) setAuth(opts *C.pserver_server_options_t) {
	if o.Job == "" && o.AuthTokensFile == "" && o.AuthCertRule == "" {
		return
	}
	job, tokens, rule := C.CString(o.Job), C.CString(o.AuthTokensFile), C.CString(o.AuthCertRule)
	C.pserver_server_options_set_auth(opts, job, tokens, rule)
	C.free(unsafe.Pointer(job))
	C.free(unsafe.Pointer(tokens))
	C.free(unsafe.Pointer(rule))
}

// NewEtcdTLS is NewEtcd over TLS with a client certificate. NOT_FOUND names
// a file that cannot be read.
func NewEtcdTLS(endpoints string, timeout time.Duration, tls EtcdTLS) (*Etcd, error) {
	ms := timeout.Milliseconds()
	if timeout > 0 && ms == 0 {
		ms = 1
	}
	ce := C.CString(endpoints)
	ca, cert, key := C.CString(tls.CA), C.CString(tls.Cert), C.CString(tls.Key)
	defer func() {
		for _, p := range []*C.char{ce, ca, cert, key} {
			C.free(unsafe.Pointer(p))
		}
	}()
	var e *C.pserver_etcd_t
	if err := cCall(func(st *C.pserver_status_t) {
		e = C.pserver_etcd_new_tls(ce, C.int64_t(ms), ca, cert, key, st)
	}); err != nil {
		return nil, fmt.Errorf("pserver: new etcd client: %w", err)
	}
	et := &Etcd{e: e}
	runtime.SetFinalizer(et, func(et *Etcd) { et.Close() })
	return et, nil
}
