package main

import (
	"flag"

	"pserver/pserver"
)

// tlsFlags are the -tls_* flags of every command that dials servers.
type tlsFlags struct {
	cert, key, ca, serverName *string
}

func addTLSFlags(fs *flag.FlagSet) *tlsFlags {
	return &tlsFlags{
		cert:       fs.String("tls_cert", "", "mutual TLS to the servers: this client's PEM certificate (with -tls_key and -tls_ca)"),
		key:        fs.String("tls_key", "", "PEM private key of -tls_cert"),
		ca:         fs.String("tls_ca", "", "PEM CA(s) the servers' certificates must chain to"),
		serverName: fs.String("tls_server_name", "", "name the servers' certificates must carry (default: the host dialled)"),
	}
}

// options is nil when no -tls_* flag is set (plaintext).
func (f *tlsFlags) options() *pserver.TLS {
	if *f.cert == "" && *f.key == "" && *f.ca == "" && *f.serverName == "" {
		return nil
	}
	return &pserver.TLS{Cert: *f.cert, Key: *f.key, CA: *f.ca, ServerName: *f.serverName}
}
