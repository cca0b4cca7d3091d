package pserver

import (
	"context"
	"errors"
	"fmt"
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

// cpuHasAESNI: /proc/cpuinfo lists the aes flag (the AEAD layer needs it).
func cpuHasAESNI() bool {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "flags") && strings.Contains(line+" ", " aes ") {
			return true
		}
	}
	return false
}

// TLS.DisableBulkAEAD on each end: data exact in every cell; the server
// counts a bulk connection on the AEAD layer only when both ends want it.
func TestBulkAEADOptionReachesTheServer(t *testing.T) {
	pki := newTestPKI(t)
	serverTLS, clientTLS := pki.issue("server", "pserver-0"), pki.issue("trainer", "trainer-0")
	for _, serverOn := range []bool{true, false} {
		for _, clientOn := range []bool{true, false} {
			name := fmt.Sprintf("server_%v_client_%v", serverOn, clientOn)
			t.Run(name, func(t *testing.T) {
				both := serverOn && clientOn
				if both && !cpuHasAESNI() {
					t.Skip("this CPU has no AES-NI: the AEAD layer is never used")
				}
				st, ct := *serverTLS, *clientTLS
				st.DisableBulkAEAD, ct.DisableBulkAEAD = !serverOn, !clientOn
				srv, err := NewServer(&ServerOptions{TLS: &st})
				if err != nil {
					t.Fatal(err)
				}
				defer srv.Close()
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				client, err := srv.Client(ctx, Options{TLS: &ct, Timeout: 60 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				defer client.Close()
				values := make([]float32, 1<<18) // 1 MiB
				for i := range values {
					values[i] = float32(i % 1000)
				}
				w, err := NewTensor(values)
				if err != nil {
					t.Fatal(err)
				}
				if err := client.Init(ctx, "big", w, &ParamConfig{Optimizer: "sgd", Settings: map[string]float64{"learning_rate": 1}}); err != nil {
					t.Fatal(err)
				}
				if err := client.FinishInit(ctx); err != nil {
					t.Fatal(err)
				}
				ones := make([]float32, len(values))
				for i := range ones {
					ones[i] = 1
				}
				g, _ := NewTensor(ones)
				if err := client.SendGrad(ctx, "big", g); err != nil {
					t.Fatal(err)
				}
				got, err := client.Get(ctx, "big")
				if err != nil {
					t.Fatal(err)
				}
				gv := got.Value().([]float32)
				if len(gv) != len(values) {
					t.Fatalf("got %d values, want %d", len(gv), len(values))
				}
				for i := range gv {
					if gv[i] != values[i]-1 {
						t.Fatalf("value %d = %v, want %v", i, gv[i], values[i]-1)
					}
				}
				stats, err := client.Stats(ctx)
				if err != nil || len(stats) != 1 {
					t.Fatalf("stats = %v, %v", stats, err)
				}
				aead := stats[0].BulkAEADConnections
				if both && aead < 1 {
					t.Fatalf("both ends want the AEAD layer, the server counts %d AEAD connections", aead)
				}
				if !both && aead != 0 {
					t.Fatalf("an end turned the AEAD layer off, the server counts %d AEAD connections", aead)
				}
			})
		}
	}
}
