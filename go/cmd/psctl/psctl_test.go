package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pserver-project/pserver/go/pserver"
)

// The test binary doubles as psctl when PSCTL_TEST_MAIN is set, so `local`
// runs as a real process that gets a real SIGTERM.
func TestMain(m *testing.M) {
	if os.Getenv("PSCTL_TEST_MAIN") == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

func psctl(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{
		{"--help"}, {"local", "--help"}, {"status", "-help"}, {"health", "-help"}, {"desired", "--help"},
		{"checkpoint", "--help"}, {"checkpoint", "save", "--help"}, {"checkpoint", "ls", "-h"},
		{"checkpoint", "verify", "--help"}, {"checkpoint", "reshard", "-h"}, {"params", "--help"},
		{"top", "-h"}, {"tables", "--help"}, {"help", "status"}, {"help", "top"},
	} {
		code, out, _ := psctl(t, args...)
		if code != 0 || !strings.Contains(out, "Usage: psctl") && !strings.Contains(out, "Usage: psctl <command>") {
			t.Errorf("psctl %v: code %d, output %q", args, code, out)
		}
	}
	if code, _, _ := psctl(t, "frobnicate"); code != 2 {
		t.Errorf("unknown command: code %d", code)
	}
	if code, _, _ := psctl(t, "params"); code != 2 {
		t.Errorf("params without a source: code %d", code)
	}
}

func TestCheckpointCommands(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	cluster, err := pserver.NewLocalCluster(2, &pserver.ServerOptions{CheckpointDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	client, err := pserver.NewClient(ctx, pserver.Options{Servers: cluster.Addresses()})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	w, _ := pserver.NewTensor(make([]float32, 12), 3, 4)
	step, _ := pserver.NewTensor([]int64{0})
	for name, v := range map[string]*pserver.Tensor{"layer/w": w, "step": step} {
		if err := client.Init(ctx, name, v, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := client.FinishInit(ctx); err != nil {
		t.Fatal(err)
	}
	// In any order: psctl asks each server its index.
	a := cluster.Addresses()
	servers := a[1] + "," + a[0]
	if code, out, errs := psctl(t, "checkpoint", "save", "-servers", servers); code != 0 || !strings.Contains(out, "2 servers") {
		t.Fatalf("checkpoint save: %d %q %q", code, out, errs)
	}
	code, out, errs := psctl(t, "checkpoint", "ls", dir)
	if code != 0 || strings.Count(out, "ckpt-") != 2 || !regexp.MustCompile(`layer/w\s+float32\s+\[3 4\]\s+12\s+48`).MatchString(out) {
		t.Fatalf("checkpoint ls: %d %q %q", code, out, errs)
	}
	if code, out, errs := psctl(t, "checkpoint", "verify", dir); code != 0 || !strings.HasPrefix(out, "OK: 2 checkpoints, 2 parameters") {
		t.Fatalf("checkpoint verify: %d %q %q", code, out, errs)
	}
	code, out, _ = psctl(t, "params", "-checkpoint", dir)
	if code != 0 || !regexp.MustCompile(`step\s+int64\s+\[1\]\s+1\s+8`).MatchString(out) || !strings.Contains(out, "(2 parameters)") {
		t.Fatalf("params -checkpoint: %d %q", code, out)
	}
	code, out, _ = psctl(t, "params", "-servers", servers, "layer/w")
	if code != 0 || !regexp.MustCompile(`layer/w\s+float32\s+\[3 4\]`).MatchString(out) {
		t.Fatalf("params -servers: %d %q", code, out)
	}
	if code, _, errs := psctl(t, "params", "-servers", servers, "nope"); code != 1 || !strings.Contains(errs, "NOT_FOUND") {
		t.Fatalf("params of a missing name: %d %q", code, errs)
	}
	if code, out, _ := psctl(t, "status", "-servers", servers); code != 0 || !strings.Contains(out, "true") {
		t.Fatalf("status -servers: %d %q", code, out)
	}
	// gRPC health (grpc.health.v1): both started servers answer SERVING.
	if code, out, errs := psctl(t, "health", "-servers", servers); code != 0 || strings.Count(out, " SERVING") != 2 {
		t.Fatalf("health -servers: %d %q %q", code, out, errs)
	}
	if code, _, _ := psctl(t, "health"); code != 2 {
		t.Fatalf("health without -servers or -etcd: exit %d, want 2", code)
	}
	code, out, _ = psctl(t, "status", "-servers", servers, "-o", "json")
	var st statusJSON
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st.Source != "servers" || st.Live != 2 || len(st.Servers) != 2 ||
		st.Servers[0].Index != 0 || st.Servers[0].Address != a[0] || st.Servers[1].Address != a[1] ||
		!st.Servers[0].Initialized || st.Servers[0].ParameterBlocks+st.Servers[1].ParameterBlocks != 2 {
		t.Fatalf("status -o json: %d %q", code, out)
	}
	// A server that is not there is a row, not a failure; the exit code says degraded.
	dead := deadAddress(t)
	code, out, errs = psctl(t, "status", "-servers", dead+","+servers, "-timeout", "30s")
	if code != 3 || !strings.Contains(out, "servers: 2 of 3 answer") || !regexp.MustCompile(`(?m)^0\s+`+a[0]+`\s+SERVING\s+true`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^-1\s+`+dead+`\s+UNREACHABLE`).MatchString(out) {
		t.Fatalf("status with a dead server: %d %q %q", code, out, errs)
	}
	code, out, _ = psctl(t, "health", "-servers", servers+","+dead, "-o", "json", "-timeout", "30s")
	var h healthJSON
	if code != 3 || json.Unmarshal([]byte(out), &h) != nil || len(h.Servers) != 3 || h.Servers[1].Health != "SERVING" ||
		h.Servers[2].Health != "UNREACHABLE" || !strings.Contains(h.Servers[2].Error, "connection refused") {
		t.Fatalf("health -o json with a dead server: %d %q", code, out)
	}
	// Commands that need every server refuse an incomplete cluster, naming what is missing.
	if code, _, errs := psctl(t, "params", "-servers", a[1], "layer/w"); code != 1 || !strings.Contains(errs, "index 0 is missing") {
		t.Fatalf("params with server 0 missing: %d %q", code, errs)
	}
	code, out, _ = psctl(t, "params", "-servers", servers, "layer/w", "step", "-o", "json")
	var params struct {
		Parameters []paramJSON `json:"parameters"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &params) != nil || fmt.Sprint(params.Parameters) != "[{layer/w float32 [3 4] 12 48} {step int64 [1] 1 8}]" {
		t.Fatalf("params -o json: %d %q", code, out)
	}
	// Without names: every parameter the live servers hold, in name order.
	code, out, errs = psctl(t, "params", "-servers", servers, "-o", "json")
	if code != 0 || json.Unmarshal([]byte(out), &params) != nil || fmt.Sprint(params.Parameters) != "[{layer/w float32 [3 4] 12 48} {step int64 [1] 1 8}]" {
		t.Fatalf("params -servers without names (ListParams): %d %q %q", code, out, errs)
	}
	code, out, _ = psctl(t, "checkpoint", "ls", dir, "-o", "json")
	var ls struct {
		Checkpoints []string    `json:"checkpoints"`
		Parameters  []paramJSON `json:"parameters"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &ls) != nil || len(ls.Checkpoints) != 2 || len(ls.Parameters) != 2 {
		t.Fatalf("checkpoint ls -o json: %d %q", code, out)
	}
	code, out, _ = psctl(t, "checkpoint", "verify", "-o", "json", dir)
	var v verifyJSON
	if code != 0 || json.Unmarshal([]byte(out), &v) != nil || !v.OK || len(v.Checkpoints) != 2 || v.Parameters != 2 {
		t.Fatalf("checkpoint verify -o json: %d %q", code, out)
	}
	if code, _, errs := psctl(t, "checkpoint", "verify", t.TempDir()); code != 1 || !strings.Contains(errs, "NOT_FOUND") {
		t.Fatalf("verify of an empty directory: %d %q", code, errs)
	}
}

// deadAddress is a 127.0.0.1 port nothing listens on.
func deadAddress(t *testing.T) string {
	t.Helper()
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", port)
}

// Usage errors: exit 2, a message naming what is wrong, nothing done.
func TestUsageErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"status", "-etcd", "127.0.0.1:1", "-servers", "127.0.0.1:2"}, "conflicting flags -etcd and -servers"},
		{[]string{"top", "-etcd", "127.0.0.1:1", "-servers", "127.0.0.1:2"}, "conflicting flags -etcd and -servers"},
		{[]string{"params", "-checkpoint", "/tmp", "-servers", "127.0.0.1:2"}, "conflicting flags -checkpoint and -servers"},
		{[]string{"params", "-checkpoint", "/tmp", "-etcd", "127.0.0.1:2"}, "conflicting flags -checkpoint and -etcd"},
		{[]string{"desired", "-etcd", "127.0.0.1:1", "-yes", "-dry_run", "3"}, "conflicting flags -yes and -dry_run"},
		{[]string{"local", "-start_etcd", "-etcd", "127.0.0.1:1"}, "conflicting flags -start_etcd and -etcd"},
		{[]string{"local", "-n", "2", "-etcd", "-cluster", "x"}, "-etcd takes endpoints"},
		{[]string{"desired", "-servers", "127.0.0.1:1", "3"}, "give -etcd"},
		{[]string{"desired", "-etcd", "127.0.0.1:1", "0"}, "N must be a whole number from 1 to 4096"},
		{[]string{"status", "-servers", "127.0.0.1:1", "-o", "yaml"}, `-o "yaml"`},
		{[]string{"status", "-servers", "127.0.0.1:1", "extra"}, `unexpected argument "extra"`},
		{[]string{"status", "-bogus"}, "flag provided but not defined: -bogus"},
		{[]string{"tables"}, "give -etcd HOST:PORT"},
		{[]string{"top", "-servers", "127.0.0.1:1", "-n", "-1"}, "-n must be 0 or more"},
		{[]string{"help", "frobnicate"}, `unknown command "frobnicate"`},
	} {
		code, out, errs := psctl(t, c.args...)
		if code != 2 || !strings.Contains(errs, c.want) || out != "" {
			t.Errorf("psctl %q: exit %d, stdout %q, stderr %q; want 2 and %q", c.args, code, out, errs, c.want)
		}
	}
	// help CMD and CMD -h: the same text, with examples.
	_, viaHelp, _ := psctl(t, "help", "top")
	_, viaFlag, _ := psctl(t, "top", "-h")
	if viaHelp != viaFlag || !strings.Contains(viaHelp, "Examples:\n  psctl top -etcd") || !strings.Contains(viaHelp, "-interval") {
		t.Errorf("help top %q, top -h %q", viaHelp, viaFlag)
	}
	if _, out, _ := psctl(t, "help"); !strings.Contains(out, "tables") || !strings.Contains(out, "3 degraded") {
		t.Errorf("help: %q", out)
	}
}

func pserverBinary(t *testing.T) string {
	if p := os.Getenv("PSCTL_PSERVER"); p != "" {
		return p
	}
	p, _ := filepath.Abs("../../../bazel-bin/cc/server/pserver")
	if _, err := os.Stat(p); err != nil {
		t.Skip("no pserver binary: set PSCTL_PSERVER")
	}
	return p
}

// startLocal runs `psctl local args...` as a process and returns its
// output lines up to "ready".
func startLocal(t *testing.T, args ...string) (*exec.Cmd, []string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"local"}, args...)...)
	cmd.Env = append(os.Environ(), "PSCTL_TEST_MAIN=1", "PSCTL_PSERVER="+pserverBinary(t))
	cmd.Stderr = os.Stderr
	// Stopped (and stops its servers) should this test binary die first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var got []string
	deadline := time.After(60 * time.Second)
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				cmd.Wait()
				t.Fatalf("psctl local exited before ready: %q", got)
			}
			got = append(got, line)
			if strings.HasPrefix(line, "ready") {
				return cmd, got
			}
		case <-deadline:
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("psctl local not ready after 60 s: %q", got)
		}
	}
}

// stopLocal sends SIGTERM and checks that psctl and every child it printed
// are gone.
func stopLocal(t *testing.T, cmd *exec.Cmd, lines []string) {
	t.Helper()
	var pids []int
	for _, line := range lines {
		if strings.HasPrefix(line, "pids ") {
			for _, f := range strings.Fields(line)[1:] {
				pid, _ := strconv.Atoi(f[strings.Index(f, "=")+1:])
				pids = append(pids, pid)
			}
		}
	}
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("psctl local after SIGTERM: %v", err)
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatal("psctl local did not stop within 30 s of SIGTERM")
	}
	for _, pid := range pids {
		// Not our children: a zombie-free check that the PID is gone.
		if err := syscall.Kill(pid, 0); err == nil {
			if data, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); !bytes.Contains(data, []byte(") Z ")) {
				t.Errorf("process %d still running after psctl stopped", pid)
			}
		}
	}
}

// localEtcd is the endpoint of the etcd `psctl local -start_etcd` printed.
func localEtcd(t *testing.T, lines []string) string {
	t.Helper()
	for _, line := range lines {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "etcd" {
			return f[1]
		}
	}
	t.Fatalf("no etcd in %q", lines)
	return ""
}

func TestLocalServersAnswer(t *testing.T) {
	dir := t.TempDir()
	cmd, lines := startLocal(t, "-n", "2", "-checkpoint_dir", dir)
	var servers []string
	for _, line := range lines {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "server" {
			servers = append(servers, f[2])
		}
	}
	if len(servers) != 2 {
		stopLocal(t, cmd, lines)
		t.Fatalf("servers in %q", lines)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	client, err := pserver.NewClient(ctx, pserver.Options{Servers: servers})
	if err == nil {
		defer client.Close()
		var stats []pserver.ServerStats
		stats, err = client.Stats(ctx)
		if err == nil && (len(stats) != 2 || stats[1].Index != 1) {
			t.Errorf("stats %+v", stats)
		}
	}
	if err != nil {
		t.Error(err)
	}
	if code, out, errs := psctl(t, "checkpoint", "save", "-servers", strings.Join(servers, ",")); code != 0 {
		t.Errorf("checkpoint save: %q %q", out, errs)
	}
	stopLocal(t, cmd, lines)
	if code, _, errs := psctl(t, "checkpoint", "verify", dir); code != 0 {
		t.Errorf("verify after stop: %q", errs)
	}
}

func TestLocalWithEtcd(t *testing.T) {
	if _, err := exec.LookPath("etcd"); err != nil {
		t.Skip("no etcd on PATH")
	}
	cmd, lines := startLocal(t, "-n", "2", "-start_etcd", "-cluster", "t", "-checkpoint_dir", t.TempDir())
	defer stopLocal(t, cmd, lines)
	endpoint := localEtcd(t, lines)
	code, out, errs := psctl(t, "status", "-etcd", endpoint, "-cluster", "t")
	if code != 0 || !strings.Contains(out, "desired servers 2, live 2") {
		t.Fatalf("status: %d %q %q", code, out, errs)
	}
	// Registered in etcd and loaded: both SERVING, found through etcd.
	if code, out, errs := psctl(t, "health", "-etcd", endpoint, "-cluster", "t"); code != 0 || strings.Count(out, " SERVING") != 2 {
		t.Fatalf("health -etcd: %d %q %q", code, out, errs)
	}
	// The servers' entries name their instances: fine with -require_instance_id.
	if code, out, errs := psctl(t, "status", "-etcd", endpoint, "-cluster", "t", "-require_instance_id"); code != 0 ||
		!strings.Contains(out, "live 2") {
		t.Fatalf("status -require_instance_id: %d %q %q", code, out, errs)
	}
	var servers []string
	for _, line := range lines {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "server" {
			servers = append(servers, f[2])
		}
	}
	// top -etcd without -metrics: the pages the servers published in their
	// /ps/<idx> values (metrics=host:port), each matched to its server.
	_, metrics := localAddresses(t, lines)
	code, out, errs = psctl(t, "top", "-etcd", endpoint, "-cluster", "t", "-n", "1", "-interval", "1ms", "-o", "json")
	var f topFrame
	if code != 0 || json.Unmarshal([]byte(out), &f) != nil || len(f.Servers) != 2 || len(metrics) != 2 {
		t.Fatalf("top -etcd without -metrics: %d %q %q (metrics %q)", code, out, errs, metrics)
	}
	for i, r := range f.Servers {
		if r.Index != i || r.MetricsAddress != metrics[i] || r.RequestsTotal == nil || r.TableRows == nil {
			t.Fatalf("top -etcd row %d: %+v, want metrics page %s", i, r, metrics[i])
		}
	}
	// A parameter, then a checkpoint through etcd discovery: published at
	// /checkpoints/<idx> once durable, and params -etcd lists its names.
	ctx0, cancel0 := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel0()
	trainer, err := pserver.NewClient(ctx0, pserver.Options{Servers: servers})
	if err != nil {
		t.Fatal(err)
	}
	w, _ := pserver.NewTensor(make([]float32, 6), 2, 3)
	if err := trainer.Init(ctx0, "layer/w", w, nil); err != nil {
		t.Fatal(err)
	}
	if err := trainer.FinishInit(ctx0); err != nil {
		t.Fatal(err)
	}
	trainer.Close()
	if code, out, errs := psctl(t, "checkpoint", "save", "-etcd", endpoint, "-cluster", "t"); code != 0 || !strings.Contains(out, "2 servers") {
		t.Fatalf("checkpoint save -etcd: %d %q %q", code, out, errs)
	}
	code, out, errs = psctl(t, "params", "-etcd", endpoint, "-cluster", "t", "-o", "json")
	var params struct {
		Parameters []paramJSON `json:"parameters"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &params) != nil || len(params.Parameters) != 1 ||
		fmt.Sprint(params.Parameters[0]) != "{layer/w float32 [2 3] 6 24}" {
		t.Fatalf("params -etcd (names from the published checkpoints): %d %q %q", code, out, errs)
	}

	// desired: says what it does; off a terminal it needs -yes and changes
	// nothing without it.
	code, out, errs = psctl(t, "desired", "-etcd", endpoint, "-cluster", "t", "3")
	if code != 2 || !strings.Contains(errs, "pass -yes") || !strings.Contains(out, "2 -> 3") ||
		!strings.Contains(out, "start 1 more") || !strings.Contains(out, "placement is fixed while a job runs") {
		t.Fatalf("desired without -yes: %d %q %q", code, out, errs)
	}
	if code, out, _ := psctl(t, "status", "-etcd", endpoint, "-cluster", "t"); code != 0 || !strings.Contains(out, "desired servers 2,") {
		t.Fatalf("desired without -yes changed the count: %d %q", code, out)
	}
	if code, out, errs := psctl(t, "desired", "-etcd", endpoint, "-cluster", "t", "-dry_run", "3"); code != 0 || !strings.Contains(out, "2 -> 3") ||
		strings.Contains(out, "= 3") {
		t.Fatalf("desired -dry_run: %d %q %q", code, out, errs)
	}
	if code, _, errs := psctl(t, "desired", "-etcd", endpoint, "-cluster", "t", "-yes", "3"); code != 0 {
		t.Fatalf("desired -yes: %q", errs)
	}
	// A trainer's registration, as the C++ client writes it (WorkerInfo as
	// protobuf JSON, int64 fields as strings).
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e, err := newEtcd([]string{endpoint}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	worker, err := pserver.Keys("t").Worker("trainer-7")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.put(ctx, worker,
		`{"id":"trainer-7","host":"box","pid":"4242","startTimeMicros":"1795336322451475"}`); err != nil {
		t.Fatal(err)
	}
	// Index 2 is down: listed as a row, and the exit code says degraded.
	code, out, _ = psctl(t, "status", "-etcd", endpoint, "-cluster", "t")
	if code != 3 || !strings.Contains(out, "desired servers 3, live 2, workers 1") ||
		!regexp.MustCompile(`(?m)^2\s+\(down\)\s+DOWN`).MatchString(out) ||
		strings.Count(out, "/ckpt-") != 2 ||
		!regexp.MustCompile(`trainer-7\s+box\s+4242\s+2026-11-22 08:32:02Z`).MatchString(out) {
		t.Fatalf("status after desired 3: %d %q", code, out)
	}
	code, out, _ = psctl(t, "status", "-etcd", endpoint, "-cluster", "t", "-o", "json")
	var st statusJSON
	if code != 3 || json.Unmarshal([]byte(out), &st) != nil || st.Desired != "3" || st.Live != 2 || !st.Degraded ||
		len(st.Servers) != 3 || st.Servers[2].Health != "DOWN" || st.Servers[0].Health != "SERVING" ||
		st.Servers[1].Checkpoint == nil || len(st.Workers) != 1 || st.Workers[0].Pid != "4242" {
		t.Fatalf("status -o json after desired 3: %d %q", code, out)
	}
	if code, out, _ := psctl(t, "health", "-etcd", endpoint, "-cluster", "t"); code != 3 || strings.Count(out, " SERVING") != 2 ||
		!strings.Contains(out, "DOWN") {
		t.Fatalf("health with index 2 down: %d %q", code, out)
	}
	// A hand-written entry (what `etcdctl put` writes) is listed, and refused
	// with -require_instance_id, naming the key.
	bare := pserver.Keys("t").Server(2)
	if err := e.put(ctx, bare, "127.0.0.1:1"); err != nil {
		t.Fatal(err)
	}
	// Nothing listens there: UNREACHABLE, the others still listed.
	if code, out, _ := psctl(t, "status", "-etcd", endpoint, "-cluster", "t"); code != 3 || !strings.Contains(out, "live 3") ||
		!regexp.MustCompile(`(?m)^2\s+127\.0\.0\.1:1\s+UNREACHABLE`).MatchString(out) || strings.Count(out, " SERVING ") != 2 {
		t.Fatalf("status with a bare entry: %d %q", code, out)
	}
	code, out, errs = psctl(t, "status", "-etcd", endpoint, "-cluster", "t", "-require_instance_id")
	if code != 1 || !strings.Contains(out, "live 3") ||
		!strings.Contains(errs, bare+` is "127.0.0.1:1", which names no server instance`) {
		t.Fatalf("status -require_instance_id with a bare entry: %d %q %q", code, out, errs)
	}
	// A malformed entry (etcd's contents are not trusted): refused, the index
	// shown DOWN with why, the others still listed.
	if err := e.put(ctx, bare, "127.0.0.1:1 instance=ab metrics=nowhere"); err != nil {
		t.Fatal(err)
	}
	code, out, _ = psctl(t, "status", "-etcd", endpoint, "-cluster", "t", "-o", "json")
	var malformed statusJSON
	if code != 3 || json.Unmarshal([]byte(out), &malformed) != nil || len(malformed.Servers) != 3 ||
		malformed.Servers[2].Health != "DOWN" || !strings.Contains(malformed.Servers[2].Error, bare) ||
		!strings.Contains(malformed.Servers[2].Error, "metrics= is not host:port") ||
		malformed.Servers[0].Health != "SERVING" || malformed.Servers[1].Health != "SERVING" {
		t.Fatalf("status with a malformed entry: %d %q", code, out)
	}
}

// savedCheckpoints writes `saves` checkpoints of a 2-server local cluster into
// a new directory (plus the final ones Close writes) and returns it.
func savedCheckpoints(t *testing.T, saves int) string {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	cluster, err := pserver.NewLocalCluster(2, &pserver.ServerOptions{CheckpointDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	client, err := pserver.NewClient(ctx, pserver.Options{Servers: cluster.Addresses()})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	w, _ := pserver.NewTensor(make([]float32, 12), 3, 4)
	if err := client.Init(ctx, "w", w, nil); err != nil {
		t.Fatal(err)
	}
	if err := client.FinishInit(ctx); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < saves; i++ {
		if err := client.SaveCheckpoint(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// checkpointsOf is the ckpt-* directories of every shard under dir, oldest first per shard.
func checkpointsOf(t *testing.T, dir string) []string {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(dir, "shard-*", "ckpt-*"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no checkpoints under %s: %v", dir, err)
	}
	sort.Strings(paths)
	return paths
}

func flipByte(t *testing.T, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil || len(data) <= 16 {
		t.Fatalf("read %s: %v (%d bytes)", path, err, len(data))
	}
	data[len(data)/2] ^= 0x5a
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// psctl local -replicas 2: every process backs up the other's shard
// (the servers' --replicas), and status shows each shard's backups.
func TestLocalWithReplicas(t *testing.T) {
	if _, err := exec.LookPath("etcd"); err != nil {
		t.Skip("no etcd on PATH")
	}
	if code, _, errs := psctl(t, "local", "-n", "2", "-replicas", "3", "-start_etcd"); code != 2 || !strings.Contains(errs, "-replicas must be from 1 to -n (2)") {
		t.Fatalf("local -replicas 3 with -n 2: %d %q", code, errs)
	}
	if code, _, errs := psctl(t, "local", "-n", "2", "-replicas", "2"); code != 2 || !strings.Contains(errs, "needs etcd") {
		t.Fatalf("local -replicas 2 without etcd: %d %q", code, errs)
	}
	cmd, lines := startLocal(t, "-n", "2", "-replicas", "2", "-start_etcd", "-cluster", "r")
	defer stopLocal(t, cmd, lines)
	endpoint := ""
	for _, line := range lines {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "etcd" {
			endpoint = f[1]
		}
	}
	if endpoint == "" {
		t.Fatalf("no etcd in %q", lines)
	}
	// The standby slots attach once both primaries serve: wait for it (bounded).
	var st statusJSON
	backedUp := false
	for try := 0; try < 600 && !backedUp; try++ {
		code, out, _ := psctl(t, "status", "-etcd", endpoint, "-cluster", "r", "-o", "json")
		st = statusJSON{}
		backedUp = code == 0 && json.Unmarshal([]byte(out), &st) == nil && len(st.Servers) == 2
		for _, s := range st.Servers {
			backedUp = backedUp && s.Backups != nil && *s.Backups == 1
		}
		if !backedUp {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if !backedUp {
		t.Fatalf("every shard never had one backup: %+v", st)
	}
	code, out, errs := psctl(t, "status", "-etcd", endpoint, "-cluster", "r")
	if code != 0 || !regexp.MustCompile(`(?m)^0\s+\S+\s+SERVING.*\s1\s+-\s+-\s*$`).MatchString(out) {
		t.Fatalf("status table with backups: %d %q %q", code, out, errs)
	}
}

func TestVerifyChecksEveryCheckpointAndFailsOnAny(t *testing.T) {
	dir := savedCheckpoints(t, 2)
	all := checkpointsOf(t, dir)
	code, out, errs := psctl(t, "checkpoint", "verify", dir)
	if code != 0 || !strings.HasPrefix(out, fmt.Sprintf("OK: %d checkpoints, 1 parameters", len(all))) {
		t.Fatalf("verify of good checkpoints: %d %q %q", code, out, errs)
	}
	for _, p := range all {
		if !strings.Contains(out, "verified "+p+"\n") {
			t.Errorf("verify does not list %s: %q", p, out)
		}
	}
	// The newest manifest of the last shard is damaged: a reader falls back
	// to the previous one, but verify must not call this good. And an old
	// checkpoint's data, which no reader opens.
	newest := all[len(all)-1]
	var old string
	for _, p := range all {
		if st, err := os.Stat(filepath.Join(p, "data-00000.bin")); err == nil && st.Size() > 0 {
			old = p
			break
		}
	}
	if old == "" || old == newest {
		t.Fatalf("no old checkpoint with data among %q", all)
	}
	flipByte(t, filepath.Join(newest, "MANIFEST"))
	flipByte(t, filepath.Join(old, "data-00000.bin"))
	code, out, errs = psctl(t, "checkpoint", "verify", dir)
	if code != 1 {
		t.Fatalf("verify with damaged checkpoints: code %d, out %q, err %q", code, out, errs)
	}
	for _, p := range []string{newest, old} {
		if !strings.Contains(out, "FAILED "+p+": ") {
			t.Errorf("verify does not name the damaged %s: %q", p, out)
		}
	}
	if !strings.Contains(out, "checksum validation failed") || !strings.Contains(errs, fmt.Sprintf("2 of %d checkpoints", len(all))) || strings.Contains(out, "OK:") {
		t.Errorf("verify output: %q %q", out, errs)
	}
	// One shard's directory, and one checkpoint, alone.
	if code, out, _ := psctl(t, "checkpoint", "verify", filepath.Dir(newest)); code != 1 || !strings.Contains(out, "FAILED "+newest) {
		t.Errorf("verify of one shard: %d %q", code, out)
	}
	if code, out, _ := psctl(t, "checkpoint", "verify", old); code != 1 || !strings.Contains(out, "FAILED "+old) {
		t.Errorf("verify of one checkpoint: %d %q", code, out)
	}
}

// psctlChild runs psctl as a child process with a deadline, so that a psctl
// blocked on a FIFO fails the test instead of hanging it.
func psctlChild(t *testing.T, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), "PSCTL_TEST_MAIN=1")
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("psctl %v still running after 30 s (blocked on a FIFO?): %q", args, out)
	}
	code := 0
	if exitErr, ok := err.(*exec.ExitError); ok {
		code = exitErr.ExitCode()
	} else if err != nil {
		t.Fatalf("psctl %v: %v", args, err)
	}
	return code, string(out)
}

func replaceWithFifo(t *testing.T, path string) {
	t.Helper()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestFifoInACheckpointIsRefusedWithoutBlocking(t *testing.T) {
	dir := savedCheckpoints(t, 1)
	all := checkpointsOf(t, dir)
	data := filepath.Join(all[0], "data-00000.bin")
	replaceWithFifo(t, data)
	code, out := psctlChild(t, "checkpoint", "verify", dir)
	if code != 1 || !strings.Contains(out, "FAILED "+all[0]) || !strings.Contains(out, data+": is a FIFO, not a regular file") {
		t.Errorf("verify with a FIFO data file: %d %q", code, out)
	}
	// Every manifest of shard 1 a FIFO: nothing there to fall back to.
	var manifest string
	for _, p := range all {
		if strings.Contains(p, "/shard-1/") {
			manifest = filepath.Join(p, "MANIFEST")
			replaceWithFifo(t, manifest)
		}
	}
	code, out = psctlChild(t, "checkpoint", "ls", dir)
	if code != 1 || !strings.Contains(out, manifest+": is a FIFO, not a regular file") {
		t.Errorf("ls with a FIFO manifest: %d %q", code, out)
	}
	code, out = psctlChild(t, "checkpoint", "verify", dir)
	if code != 1 || !strings.Contains(out, manifest+": is a FIFO") {
		t.Errorf("verify with a FIFO manifest: %d %q", code, out)
	}
}

// checkpoint reshard: a 3-server cluster's checkpoints (a parameter in
// blocks over every server, an Adam table) rewritten for 2 servers, which
// then serve the very same values; refusals leave nothing behind.
func TestCheckpointReshard(t *testing.T) {
	ctx := context.Background()
	from := t.TempDir()
	to := filepath.Join(t.TempDir(), "two")
	keys := make([]uint64, 50)
	for i := range keys {
		keys[i] = uint64(i * 977)
	}
	// read returns w and the table's rows from the servers of `cluster`.
	read := func(cluster *pserver.LocalCluster) ([]byte, []float32) {
		t.Helper()
		client, err := pserver.NewClient(ctx, pserver.Options{Servers: cluster.Addresses(), BlockBytes: 64})
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()
		w, err := client.Get(ctx, "w")
		if err != nil {
			t.Fatal(err)
		}
		table, err := client.CreateTable(ctx, "emb", pserver.TableConfig{Dim: 2, Optimizer: "adam"})
		if err != nil {
			t.Fatal(err)
		}
		defer table.Close()
		rows := make([]float32, len(keys)*2)
		if err := table.Pull(ctx, keys, rows); err != nil {
			t.Fatal(err)
		}
		return w.Bytes(), rows
	}

	cluster, err := pserver.NewLocalCluster(3, &pserver.ServerOptions{CheckpointDir: from})
	if err != nil {
		t.Fatal(err)
	}
	client, err := pserver.NewClient(ctx, pserver.Options{Servers: cluster.Addresses(), BlockBytes: 64})
	if err != nil {
		t.Fatal(err)
	}
	values := make([]float32, 100) // 400 bytes: 7 blocks of 64 bytes over 3 servers
	for i := range values {
		values[i] = float32(i) / 3
	}
	w, _ := pserver.NewTensor(values, 100)
	if err := client.Init(ctx, "w", w, &pserver.ParamConfig{Optimizer: "adam"}); err != nil {
		t.Fatal(err)
	}
	if err := client.FinishInit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := client.SendGrad(ctx, "w", w); err != nil {
		t.Fatal(err)
	}
	table, err := client.CreateTable(ctx, "emb", pserver.TableConfig{Dim: 2, Optimizer: "adam"})
	if err != nil {
		t.Fatal(err)
	}
	grads := make([]float32, len(keys)*2)
	for i := range grads {
		grads[i] = float32(i%7) - 3
	}
	if err := table.Push(ctx, keys, grads); err != nil {
		t.Fatal(err)
	}
	table.Close()
	client.Close()
	wantW, wantRows := read(cluster)
	cluster.Close() // writes each shard's final checkpoint

	code, out, errs := psctl(t, "checkpoint", "reshard", "-from", from, "-to", to, "-servers", "2")
	if code != 0 || !strings.Contains(out, "wrote shard 2/2") ||
		!strings.Contains(out, "resharded 3 servers' checkpoints to 2") {
		t.Fatalf("checkpoint reshard: %d %q %q", code, out, errs)
	}
	if shards, _ := filepath.Glob(filepath.Join(to, "shard-*", "ckpt-*")); len(shards) != 2 {
		t.Fatalf("resharded checkpoints: %v", shards)
	}
	two, err := pserver.NewLocalCluster(2, &pserver.ServerOptions{CheckpointDir: to})
	if err != nil {
		t.Fatal(err)
	}
	gotW, gotRows := read(two)
	two.Close()
	if !bytes.Equal(gotW, wantW) || fmt.Sprint(gotRows) != fmt.Sprint(wantRows) {
		t.Fatalf("2 servers read w %v rows %v, 3 servers had %v %v", gotW, gotRows, wantW, wantRows)
	}

	// Refusals: a non-empty output, a missing shard, a bad count.
	if code, _, errs := psctl(t, "checkpoint", "reshard", "-from", from, "-to", to, "-servers", "4"); code != 1 ||
		!strings.Contains(errs, "is not empty") {
		t.Fatalf("reshard into a non-empty directory: %d %q", code, errs)
	}
	if err := os.RemoveAll(filepath.Join(from, "shard-2")); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(t.TempDir(), "four")
	if code, _, errs := psctl(t, "checkpoint", "reshard", "-from", from, "-to", other, "-servers", "4"); code != 1 ||
		!strings.Contains(errs, "FAILED_PRECONDITION") || !strings.Contains(errs, "shard 2 of 3 is missing") {
		t.Fatalf("reshard with a shard missing: %d %q", code, errs)
	}
	if _, err := os.Stat(other); !os.IsNotExist(err) {
		t.Fatalf("a failed reshard left %s: %v", other, err)
	}
	if code, _, errs := psctl(t, "checkpoint", "reshard", "-from", from, "-to", other, "-servers", "5000"); code != 1 ||
		!strings.Contains(errs, "INVALID_ARGUMENT") {
		t.Fatalf("reshard to 5000 servers: %d %q", code, errs)
	}
	if code, _, _ := psctl(t, "checkpoint", "reshard", "-from", from, "-to", other); code != 2 {
		t.Fatalf("reshard without -servers: exit %d, want 2 (usage)", code)
	}
}

// README.md's psctl block, run as written against the cluster its first
// line starts: PORT is that etcd's port, M0,M1 its servers' metrics pages,
// /tmp/ps a temporary directory; top gets -n 1 (it runs until Ctrl-C) and
// desired, off a terminal, must refuse without -yes. Skipped where the test
// has no README (PSCTL_README, set by //go:go_test).
func TestReadmePsctlBlock(t *testing.T) {
	readme := os.Getenv("PSCTL_README")
	if readme == "" {
		t.Skip("PSCTL_README not set")
	}
	if _, err := exec.LookPath("etcd"); err != nil {
		t.Skip("no etcd on PATH")
	}
	data, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	start := strings.Index(text, "**psctl**")
	if start < 0 {
		t.Fatal("README.md has no **psctl** block")
	}
	block := text[start:]
	block = block[strings.Index(block, "```sh\n")+6:]
	block = block[:strings.Index(block, "```")]
	var commands [][]string
	for _, line := range strings.Split(strings.TrimSpace(block), "\n") {
		if i := strings.Index(line, "#"); i >= 0 {
			line = line[:i]
		}
		const prefix = "bazel run //go/cmd/psctl -- "
		if !strings.HasPrefix(line, prefix) {
			t.Fatalf("README.md psctl line %q does not start with %q", line, prefix)
		}
		commands = append(commands, strings.Fields(strings.TrimPrefix(line, prefix)))
	}
	if len(commands) < 8 || commands[0][0] != "local" {
		t.Fatalf("README.md's psctl block: %q", commands)
	}
	dir := t.TempDir()
	subst := func(args []string, etcdPort string, metrics []string) []string {
		out := make([]string, len(args))
		for i, a := range args {
			a = strings.ReplaceAll(a, "/tmp/ps", dir)
			a = strings.ReplaceAll(a, "PORT", etcdPort)
			a = strings.ReplaceAll(a, "M0,M1", strings.Join(metrics, ","))
			out[i] = a
		}
		return out
	}
	cmd, lines := startLocal(t, subst(commands[0][1:], "", nil)...)
	defer stopLocal(t, cmd, lines)
	endpoint := ""
	var metrics []string
	for _, line := range lines {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "etcd" {
			endpoint = f[1]
		}
		if len(f) == 3 && f[0] == "metrics" {
			metrics = append(metrics, f[2])
		}
	}
	if endpoint == "" || len(metrics) != 3 {
		t.Fatalf("etcd and 3 metrics pages in %q", lines)
	}
	port := endpoint[strings.LastIndex(endpoint, ":")+1:]
	// Something to list: a parameter and a table.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	client, err := pserver.NewClient(ctx, pserver.Options{Etcd: endpoint})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	w, _ := pserver.NewTensor(make([]float32, 4), 4)
	if err := client.Init(ctx, "w", w, nil); err != nil {
		t.Fatal(err)
	}
	if err := client.FinishInit(ctx); err != nil {
		t.Fatal(err)
	}
	table, err := client.CreateTable(ctx, "emb", pserver.TableConfig{Dim: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer table.Close()
	if err := table.Push(ctx, []uint64{1, 2, 3}, make([]float32, 6)); err != nil {
		t.Fatal(err)
	}
	for _, c := range commands[1:] {
		args := subst(c, port, metrics)
		want := 0
		switch args[0] {
		case "top":
			args = append(args, "-n", "1", "-interval", "1ms")
		case "desired":
			want = 2
		}
		code, out, errs := psctl(t, args...)
		if code != want || (want == 0 && out == "") {
			t.Errorf("README.md's psctl %q: exit %d (want %d), %q %q", args, code, want, out, errs)
		}
		if args[0] == "tables" && !regexp.MustCompile(`(?m)^emb\s+\d+\s+3\s`).MatchString(out) {
			t.Errorf("README.md's psctl tables: %q", out)
		}
		if args[0] == "desired" && !strings.Contains(errs, "-yes") {
			t.Errorf("README.md's psctl desired: %q", errs)
		}
	}
}
