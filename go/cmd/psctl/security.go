package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/pserver-project/pserver/go/pserver"
)

// securityFlags are the flags of every command that reaches servers or etcd
// (docs/security.md): mutual TLS to the servers, a bearer token for servers
// with roles, read from a file (not the command line, where other users
// could see it), etcd's TLS client certificate, and registry fencing.
type securityFlags struct {
	cert, key, ca, serverName            *string
	tokenFile, etcdCA, etcdCert, etcdKey *string
	requireInstanceID, bulkAEAD          *bool
}

func addSecurityFlags(fs *flag.FlagSet) *securityFlags {
	return &securityFlags{
		cert:              fs.String("tls_cert", "", "mutual TLS to the servers: this client's PEM certificate (with -tls_key and -tls_ca)"),
		key:               fs.String("tls_key", "", "PEM private key of -tls_cert"),
		ca:                fs.String("tls_ca", "", "PEM CA(s) the servers' certificates must chain to"),
		serverName:        fs.String("tls_server_name", "", "name the servers' certificates must carry (default: the host dialled)"),
		tokenFile:         fs.String("token_file", "", "a file holding the bearer token for servers with roles (--auth_tokens_file)"),
		etcdCA:            fs.String("etcd_tls_ca", "", "etcd over TLS: the CA (PEM) that signed etcd's certificate"),
		etcdCert:          fs.String("etcd_tls_cert", "", "etcd over TLS: this client's certificate (PEM), for etcd --client-cert-auth"),
		etcdKey:           fs.String("etcd_tls_key", "", "etcd over TLS: the key of -etcd_tls_cert (PEM)"),
		requireInstanceID: fs.Bool("require_instance_id", false, "refuse a /ps/<idx> entry in etcd that names no server instance (a bare host:port, as etcdctl writes it)"),
		bulkAEAD:          fs.Bool("tls_bulk_aead", true, "with TLS: use the bulk channel's AEAD layer with servers that offer it (false: TLS records)"),
	}
}

// tls is nil when no -tls_* flag is set (plaintext).
func (f *securityFlags) tls() *pserver.TLS {
	if *f.cert == "" && *f.key == "" && *f.ca == "" && *f.serverName == "" {
		return nil
	}
	return &pserver.TLS{Cert: *f.cert, Key: *f.key, CA: *f.ca, ServerName: *f.serverName,
		DisableBulkAEAD: !*f.bulkAEAD}
}

// token is the -token_file's token ("" without the flag).
func (f *securityFlags) token() (string, error) {
	if *f.tokenFile == "" {
		return "", nil
	}
	b, err := os.ReadFile(*f.tokenFile)
	if err != nil {
		return "", fmt.Errorf("-token_file: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// etcdTLS is nil when no -etcd_tls_* flag is set (plaintext).
func (f *securityFlags) etcdTLS() *pserver.EtcdTLS {
	if *f.etcdCA == "" && *f.etcdCert == "" && *f.etcdKey == "" {
		return nil
	}
	return &pserver.EtcdTLS{CA: *f.etcdCA, Cert: *f.etcdCert, Key: *f.etcdKey}
}

// newClient connects with opts plus these flags' TLS, token, etcd TLS and fencing.
func (f *securityFlags) newClient(ctx context.Context, opts pserver.Options) (*pserver.Client, error) {
	opts, err := f.clientOptions(opts)
	if err != nil {
		return nil, err
	}
	return pserver.NewClient(ctx, opts)
}

// clientOptions adds TLS, the token, etcd TLS and fencing to opts.
func (f *securityFlags) clientOptions(opts pserver.Options) (pserver.Options, error) {
	token, err := f.token()
	opts.TLS = f.tls()
	opts.Token = token
	opts.EtcdTLS = f.etcdTLS()
	opts.RequireInstanceID = *f.requireInstanceID
	return opts, err
}
