package pserver

// #include <stdlib.h>
// #include "pserver.h"
// #include "pserver_cluster.h"
import "C"

import (
	"fmt"
	"unsafe"
)

// TLS turns on mutual TLS (docs/security.md): Cert and Key are this side's
// PEM certificate and private key, CA the PEM CA(s) the peer's certificate
// must chain to. A client also checks that each server's certificate names
// the host it dials, or ServerName when set. A server requires every client
// to present a certificate from CA and re-reads its files every
// ReloadSeconds (default 60), so replacing them rotates the certificates
// without a restart. The files are checked when the client or server is
// made: an error names the file and what is wrong (missing, not PEM,
// expired, key not the certificate's).
//
// With TLS the bulk channel switches, after the handshake, to an AEAD layer
// (AES-128-GCM keyed from the TLS session, docs/security.md) when both ends
// want it (the default) and the CPU has AES-NI; otherwise it keeps TLS
// records. The data is the same either way; ServerStats.BulkAEADConnections
// counts a server's connections on the layer.
type TLS struct {
	Cert, Key, CA string
	// ServerName: clients only; the name servers' certificates must carry.
	ServerName string
	// ReloadSeconds: servers only; how often the files are re-read (>= 1).
	ReloadSeconds int
	// DisableBulkAEAD keeps the bulk channel on TLS records: a client does
	// not ask for the AEAD layer, a server offers it to no client (pserver
	// --tls_bulk_aead=false). The zero value uses the layer.
	DisableBulkAEAD bool
}

// bulkAEAD is the C ABI's on (1) or off (0) for t.
func (t *TLS) bulkAEAD() C.int32_t {
	if t.DisableBulkAEAD {
		return 0
	}
	return 1
}

// applyToClient sets t (nil: none) on the client options.
func (t *TLS) applyToClient(opts *C.pserver_client_options_t) error {
	if t == nil {
		return nil
	}
	if err := t.call(func(cert, key, ca *C.char, st *C.pserver_status_t) {
		C.pserver_client_options_set_tls(opts, cert, key, ca, st)
	}); err != nil {
		return fmt.Errorf("pserver: client TLS: %w", err)
	}
	if t.ServerName != "" {
		name := C.CString(t.ServerName)
		defer C.free(unsafe.Pointer(name))
		C.pserver_client_options_set_tls_server_name(opts, name)
	}
	C.pserver_client_options_set_tls_bulk_aead(opts, t.bulkAEAD())
	return nil
}

// applyToServer sets t (nil: none) on the server options.
func (t *TLS) applyToServer(opts *C.pserver_server_options_t) error {
	if t == nil {
		return nil
	}
	if err := t.call(func(cert, key, ca *C.char, st *C.pserver_status_t) {
		C.pserver_server_options_set_tls(opts, cert, key, ca, C.int32_t(t.ReloadSeconds), st)
	}); err != nil {
		return fmt.Errorf("pserver: server TLS: %w", err)
	}
	C.pserver_server_options_set_tls_bulk_aead(opts, t.bulkAEAD())
	return nil
}

// call runs f with the three file names as C strings (freed after) and
// returns its status as an error.
func (t *TLS) call(f func(cert, key, ca *C.char, st *C.pserver_status_t)) error {
	cert, key, ca := C.CString(t.Cert), C.CString(t.Key), C.CString(t.CA)
	defer C.free(unsafe.Pointer(cert))
	defer C.free(unsafe.Pointer(key))
	defer C.free(unsafe.Pointer(ca))
	return cCall(func(st *C.pserver_status_t) { f(cert, key, ca, st) })
}
