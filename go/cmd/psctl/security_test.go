package main

import (
	"flag"
	"io"
	"testing"
)

// -tls_bulk_aead (default true) reaches the client's TLS options: false
// keeps the bulk channel on TLS records.
func TestTLSBulkAEADFlag(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		disable bool
	}{
		{[]string{"-tls_cert", "c.pem", "-tls_key", "c.key", "-tls_ca", "ca.pem"}, false},
		{[]string{"-tls_cert", "c.pem", "-tls_key", "c.key", "-tls_ca", "ca.pem", "-tls_bulk_aead=false"}, true},
	} {
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		f := addSecurityFlags(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		tls := f.tls()
		if tls == nil || tls.DisableBulkAEAD != tc.disable {
			t.Fatalf("%v: TLS %+v, want DisableBulkAEAD %v", tc.args, tls, tc.disable)
		}
	}
}
