package pserver

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testPKI makes a CA and certificates it signs with the openssl CLI (as
// cc/testing/test_certs.h does for C++), in t's temporary directory.
type testPKI struct {
	t   *testing.T
	dir string
}

func newTestPKI(t *testing.T) *testPKI {
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Skip("needs the openssl CLI")
	}
	p := &testPKI{t: t, dir: t.TempDir()}
	p.run(p.dir, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
		"-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=ca",
		"-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign")
	return p
}

func (p *testPKI) run(dir string, args ...string) {
	cmd := exec.Command("openssl", args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		p.t.Fatalf("openssl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func (p *testPKI) ca() string { return filepath.Join(p.dir, "ca.pem") }

// issue returns the TLS of a new certificate for cn (SAN IP 127.0.0.1) signed
// by the CA.
func (p *testPKI) issue(stem, cn string) *TLS {
	ext := filepath.Join(p.dir, stem+".ext")
	if err := os.WriteFile(ext, []byte("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n"), 0o600); err != nil {
		p.t.Fatal(err)
	}
	p.run(p.dir, "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
		"-keyout", stem+".key", "-out", stem+".csr", "-subj", "/CN="+cn)
	p.run(p.dir, "x509", "-req", "-in", stem+".csr", "-CA", "ca.pem", "-CAkey", "ca.key",
		"-CAcreateserial", "-days", "2", "-extfile", ext, "-out", stem+".pem")
	return &TLS{Cert: filepath.Join(p.dir, stem+".pem"), Key: filepath.Join(p.dir, stem+".key"), CA: p.ca()}
}

func TestMutualTLS(t *testing.T) {
	pki := newTestPKI(t)
	srv, err := NewServer(&ServerOptions{TLS: pki.issue("server", "pserver-0")})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	client, err := srv.Client(ctx, Options{TLS: pki.issue("trainer", "trainer-0")})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	if _, err := client.Stats(ctx); err != nil {
		t.Fatalf("stats over TLS: %v", err)
	}

	plain, err := srv.Client(ctx, Options{Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	_, err = plain.Stats(ctx)
	if !errors.Is(err, ErrDeadlineExceeded) || !strings.Contains(err.Error(), "requires TLS") {
		t.Fatalf("plaintext client to a TLS server: got %v, want DEADLINE_EXCEEDED saying it requires TLS", err)
	}
}

func TestTLSFilesAreChecked(t *testing.T) {
	pki := newTestPKI(t)
	bad := pki.issue("trainer", "trainer-0")
	bad.Key = filepath.Join(pki.dir, "missing.key")
	_, err := NewClient(context.Background(), Options{Servers: []string{"127.0.0.1:1"}, TLS: bad})
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "missing.key") {
		t.Fatalf("got %v, want NOT_FOUND naming missing.key", err)
	}
	_, err = NewServer(&ServerOptions{TLS: &TLS{Cert: bad.Cert}})
	if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "missing: --tls_key, --tls_ca") {
		t.Fatalf("got %v, want INVALID_ARGUMENT naming the missing options", err)
	}
}
