package main

import (
	"bufio"
	"context"
	"os/exec"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pserver-project/pserver/go/pserver"
)

func TestScaleUsageErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"scale", "3"}, "give -etcd"},
		{[]string{"scale", "-servers", "127.0.0.1:1", "3"}, "give -etcd, not -servers"},
		{[]string{"scale", "-etcd", "127.0.0.1:1", "0"}, "N must be a whole number from 1 to 4096"},
		{[]string{"scale", "-etcd", "127.0.0.1:1", "-timeout", "0s", "2"}, "-timeout must be positive"},
	} {
		code, _, errs := psctl(t, c.args...)
		if code != 2 || !strings.Contains(errs, c.want) {
			t.Errorf("psctl %q: exit %d, stderr %q; want 2 and %q", c.args, code, errs, c.want)
		}
	}
}

// Real processes: etcd and two pservers (psctl local), trained values; psctl
// scale 3 while a third pserver joins, then psctl scale 2: the third exits
// on its own, and the values read back are exactly the ones written.
func TestScaleMovesBlocksBetweenRealServers(t *testing.T) {
	if _, err := exec.LookPath("etcd"); err != nil {
		t.Skip("no etcd on PATH")
	}
	cmd, lines := startLocal(t, "-n", "2", "-start_etcd", "-cluster", "s", "-placement_redirects", "-metrics=false")
	defer stopLocal(t, cmd, lines)
	endpoint := localEtcd(t, lines)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	connect := func() *pserver.Client {
		c, err := pserver.NewClient(ctx, pserver.Options{Etcd: endpoint, Cluster: "s", BlockBytes: 256})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	names := []string{"a/w", "b/w", "c/w", "d/w", "e/w", "f/w"}
	want := map[string][]float32{}
	trainer := connect()
	for i, name := range names {
		values := make([]float32, 1000)
		for e := range values {
			values[e] = float32((e+i)%16) / 4
		}
		want[name] = values
		w, _ := pserver.NewTensor(values, 1000)
		if err := trainer.Init(ctx, name, w, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := trainer.FinishInit(ctx); err != nil {
		t.Fatal(err)
	}
	trainer.Close()
	check := func(when string) {
		t.Helper()
		c := connect()
		defer c.Close()
		for _, name := range names {
			got, err := c.Get(ctx, name)
			if err != nil {
				t.Fatalf("%s: %s: %v", when, name, err)
			}
			values, _ := pserver.Values[float32](got)
			if !reflect.DeepEqual(values, want[name]) {
				t.Fatalf("%s: %s differs", when, name)
			}
		}
	}

	// The third server joins (it claims index 2 once the move began). Once
	// left out it answers redirects until it is told to stop (the test
	// stops it after checking that).
	third := exec.Command(pserverBinary(t), "--etcd="+endpoint, "--cluster=s", "--placement_redirects",
		"--depart_linger_seconds=3600")
	out, err := third.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := third.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	lingering := make(chan struct{}) // closed when it says it answers redirects
	var outMu sync.Mutex
	var thirdOutput strings.Builder
	thirdOut := func() string {
		outMu.Lock()
		defer outMu.Unlock()
		return thirdOutput.String()
	}
	go func() {
		sc := bufio.NewScanner(out)
		said := false
		for sc.Scan() {
			outMu.Lock()
			thirdOutput.WriteString(sc.Text() + "\n")
			outMu.Unlock()
			if !said && strings.Contains(sc.Text(), "answering redirects for 3600s") {
				said = true
				close(lingering)
			}
		}
		exited <- third.Wait()
	}()
	thirdExited := false
	defer func() {
		if !thirdExited {
			third.Process.Kill() // stopped by its PID
			<-exited
		}
	}()
	code, stdout, errs := psctl(t, "scale", "-etcd", endpoint, "-cluster", "s", "-timeout", "90s", "3")
	if code != 0 || !strings.Contains(stdout, "moving from 2 to 3 servers") || !strings.Contains(stdout, ": 3 servers; moved ") {
		t.Fatalf("psctl scale 3: exit %d\n%s\n%s", code, stdout, errs)
	}
	check("after 2 -> 3")

	code, stdout, errs = psctl(t, "scale", "-etcd", endpoint, "-cluster", "s", "-timeout", "90s", "-o", "json", "2")
	if code != 0 || !strings.Contains(stdout, `"from":3`) || !strings.Contains(stdout, "servers 2..2 exit") {
		t.Fatalf("psctl scale 2: exit %d\n%s\n%s", code, stdout, errs)
	}
	select {
	case <-lingering:
	case err := <-exited:
		thirdExited = true
		t.Fatalf("the departing server exited (%v) instead of answering redirects:\n%s", err, thirdOut())
	case <-time.After(60 * time.Second):
		t.Fatalf("the departing server did not say it answers redirects within 60 s:\n%s", thirdOut())
	}
	// A client still routing by three servers (given their addresses, it
	// follows no placement) is redirected by the departed server, not left
	// dialling a server that is gone.
	stale := func() *pserver.Client {
		c := connect()
		defer c.Close()
		addrs := c.Servers() // by index: servers 0 and 1 (and 2 while it is registered)
		if len(addrs) > 2 {
			addrs = addrs[:2]
		}
		const listening = "pserver 2 listening on "
		for _, line := range strings.Split(thirdOut(), "\n") {
			if strings.HasPrefix(line, listening) {
				addrs = append(addrs, strings.TrimPrefix(line, listening))
			}
		}
		if len(addrs) != 3 {
			t.Fatalf("addresses of three servers: %v\n%s", addrs, thirdOut())
		}
		s, err := pserver.NewClient(ctx, pserver.Options{Servers: addrs, BlockBytes: 256})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}()
	redirected := 0
	for _, name := range names {
		if _, err := stale.Get(ctx, name); err != nil {
			if !strings.Contains(err.Error(), "placement moved: version") {
				t.Fatalf("a stale client's read of %s: %v", name, err)
			}
			redirected++
		}
	}
	stale.Close()
	if redirected == 0 {
		t.Fatalf("no read of %d parameters reached the departed server 2", len(names))
	}
	if err := third.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		thirdExited = true
		if err != nil {
			t.Fatalf("the departing server exited with %v:\n%s", err, thirdOut())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("the departing server did not exit within 60 s of SIGTERM:\n%s", thirdOut())
	}
	if !strings.Contains(thirdOut(), "pserver 2: Terminated received, shutting down") {
		t.Errorf("the departing server's output: %q", thirdOut())
	}
	check("after 3 -> 2")
	code, stdout, _ = psctl(t, "scale", "-etcd", endpoint, "-cluster", "s", "2")
	if code != 0 || !strings.Contains(stdout, "nothing to move") {
		t.Fatalf("psctl scale 2 again: exit %d %q", code, stdout)
	}
}

// The security flags reach the coordinator (ScaleCluster with the client's
// TLS and token): a certificate that cannot be read is refused naming it,
// before etcd is asked anything (none listens at 127.0.0.1:1).
func TestScaleRefusesTLSFilesItCannotRead(t *testing.T) {
	missing := t.TempDir() + "/missing"
	code, _, errs := psctl(t, "scale", "-etcd", "127.0.0.1:1", "-tls_cert", missing+".pem",
		"-tls_key", missing+".key", "-tls_ca", missing+"-ca.pem", "3")
	if code != 1 || !strings.Contains(errs, missing) {
		t.Errorf("psctl scale with unreadable TLS files: exit %d, stderr %q; want 1 naming %s", code, errs, missing)
	}
}
