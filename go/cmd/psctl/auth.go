package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"

	"pserver/pserver"
)

// authFlags are the roles and etcd TLS flags (docs/security.md): a bearer
// token for servers with roles, read from a file (not the command line,
// where other users could see it), and etcd's TLS client certificate.
type authFlags struct {
	tokenFile, etcdCA, etcdCert, etcdKey *string
}

func addAuthFlags(fs *flag.FlagSet) *authFlags {
	return &authFlags{
		tokenFile: fs.String("token_file", "", "a file holding the bearer token for servers with roles (--auth_tokens_file)"),
		etcdCA:    fs.String("etcd_tls_ca", "", "etcd over TLS: the CA (PEM) that signed etcd's certificate"),
		etcdCert:  fs.String("etcd_tls_cert", "", "etcd over TLS: this client's certificate (PEM), for etcd --client-cert-auth"),
		etcdKey:   fs.String("etcd_tls_key", "", "etcd over TLS: the key of -etcd_tls_cert (PEM)"),
	}
}

// token is the -token_file's token ("" without the flag).
func (a *authFlags) token() (string, error) {
	if *a.tokenFile == "" {
		return "", nil
	}
	b, err := os.ReadFile(*a.tokenFile)
	if err != nil {
		return "", fmt.Errorf("-token_file: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// etcdTLS is nil when no -etcd_tls_* flag is set (plaintext).
func (a *authFlags) etcdTLS() *pserver.EtcdTLS {
	if *a.etcdCA == "" && *a.etcdCert == "" && *a.etcdKey == "" {
		return nil
	}
	return &pserver.EtcdTLS{CA: *a.etcdCA, Cert: *a.etcdCert, Key: *a.etcdKey}
}

// newClient connects with opts plus these flags' token and etcd TLS.
func (a *authFlags) newClient(ctx context.Context, opts pserver.Options) (*pserver.Client, error) {
	opts, err := a.clientOptions(opts)
	if err != nil {
		return nil, err
	}
	return pserver.NewClient(ctx, opts)
}

// clientOptions adds the token to opts.
func (a *authFlags) clientOptions(opts pserver.Options) (pserver.Options, error) {
	token, err := a.token()
	opts.Token = token
	opts.EtcdTLS = a.etcdTLS()
	return opts, err
}
