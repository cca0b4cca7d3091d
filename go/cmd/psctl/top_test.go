package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pserver-project/pserver/go/pserver"
)

// localAddresses is the server and metrics addresses `psctl local` printed.
func localAddresses(t *testing.T, lines []string) (servers, metrics []string) {
	t.Helper()
	for _, line := range lines {
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == "server" {
			servers = append(servers, f[2])
		}
		if len(f) == 3 && f[0] == "metrics" {
			metrics = append(metrics, f[2])
		}
	}
	return servers, metrics
}

// topProcess is psctl top running in this process, refreshed by lines
// written to its stdin, its frames read from its stdout.
type topProcess struct {
	refresh *io.PipeWriter
	frames  *bufio.Scanner
	code    chan int
	errs    *strings.Builder
}

func startTop(t *testing.T, args ...string) *topProcess {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	old := stdin
	stdin = inR
	t.Cleanup(func() { stdin = old })
	p := &topProcess{refresh: inW, frames: bufio.NewScanner(outR), code: make(chan int, 1), errs: &strings.Builder{}}
	p.frames.Buffer(make([]byte, 1<<16), 1<<20)
	go func() {
		code := run(append([]string{"top"}, args...), outW, p.errs)
		outW.Close()
		p.code <- code
	}()
	t.Cleanup(func() { inW.Close(); outR.Close() })
	return p
}

// frame asks for a refresh now and reads it.
func (p *topProcess) frame(t *testing.T) topFrame {
	t.Helper()
	if _, err := io.WriteString(p.refresh, "\n"); err != nil {
		t.Fatalf("psctl top stopped reading: %v (%s)", err, p.errs)
	}
	if !p.frames.Scan() {
		t.Fatalf("psctl top printed no frame: %v (%s)", p.frames.Err(), p.errs)
	}
	var f topFrame
	if err := json.Unmarshal(p.frames.Bytes(), &f); err != nil {
		t.Fatalf("frame %q: %v", p.frames.Text(), err)
	}
	return f
}

func (p *topProcess) wait(t *testing.T) int {
	t.Helper()
	select {
	case code := <-p.code:
		return code
	case <-time.After(60 * time.Second):
		t.Fatal("psctl top still running after its last refresh")
		return -1
	}
}

func sum(f topFrame, field func(topRow) float64) float64 {
	total := 0.0
	for _, r := range f.Servers {
		total += field(r)
	}
	return total
}

func val(p *float64) float64 {
	if p == nil {
		return -1
	}
	return *p
}

// psctl top against real server processes with metrics: counts and rates
// follow the pushes made between two refreshes (refreshes asked for on
// stdin, so nothing depends on timing).
func TestTop(t *testing.T) {
	cmd, lines := startLocal(t, "-n", "2")
	defer stopLocal(t, cmd, lines)
	servers, metrics := localAddresses(t, lines)
	if len(servers) != 2 || len(metrics) != 2 {
		t.Fatalf("servers %q metrics %q in %q", servers, metrics, lines)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	client, err := pserver.NewClient(ctx, pserver.Options{Servers: servers})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	w, _ := pserver.NewTensor(make([]float32, 256), 256) // 1 KiB: one block
	if err := client.Init(ctx, "w", w, nil); err != nil {
		t.Fatal(err)
	}
	if err := client.FinishInit(ctx); err != nil {
		t.Fatal(err)
	}

	// Both lists in reverse order: psctl sorts them by the servers' own index.
	top := startTop(t, "-servers", servers[1]+","+servers[0], "-metrics", metrics[1]+","+metrics[0],
		"-n", "2", "-interval", "1h", "-o", "json", "-timeout", "30s")
	first := top.frame(t)
	const pushes = 7
	for i := 0; i < pushes; i++ {
		if err := client.SendGrad(ctx, "w", w); err != nil {
			t.Fatal(err)
		}
	}
	table, err := client.CreateTable(ctx, "emb", pserver.TableConfig{Dim: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer table.Close()
	keys := []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	if err := table.Push(ctx, keys, make([]float32, len(keys)*4)); err != nil {
		t.Fatal(err)
	}
	second := top.frame(t)
	if code := top.wait(t); code != 0 {
		t.Fatalf("psctl top: exit %d, %s", code, top.errs)
	}

	for _, f := range []topFrame{first, second} {
		if len(f.Servers) != 2 || f.IntervalSeconds <= 0 {
			t.Fatalf("frame %+v", f)
		}
		for i, r := range f.Servers {
			if r.Index != i || r.Address != servers[i] || r.MetricsAddress != metrics[i] || r.Health != "SERVING" ||
				!r.Initialized || r.RequestsTotal == nil || r.OpsPerSecond == nil || r.InGBPerSecond == nil || r.TableRows == nil {
				t.Fatalf("server %d in refresh %d: %+v", i, f.Refresh, r)
			}
		}
	}
	if first.Refresh != 1 || second.Refresh != 2 {
		t.Errorf("refresh numbers %d %d", first.Refresh, second.Refresh)
	}
	grads := func(r topRow) float64 { return float64(r.GradientsApplied) }
	if got := sum(second, grads) - sum(first, grads); got != pushes {
		t.Errorf("gradients applied grew by %v between refreshes, want %d", got, pushes)
	}
	requests := func(r topRow) float64 { return val(r.RequestsTotal) }
	if got := sum(second, requests) - sum(first, requests); got < pushes+2 {
		t.Errorf("requests grew by %v, want at least %d pushes + table create + push", got, pushes)
	}
	received := func(r topRow) float64 { return val(r.ReceivedBytes) }
	if got := sum(second, received) - sum(first, received); got < pushes*1024 {
		t.Errorf("received bytes grew by %v, want at least %d", got, pushes*1024)
	}
	if got := sum(second, func(r topRow) float64 { return val(r.TableRows) }); got != float64(len(keys)) {
		t.Errorf("table rows %v, want %d", got, len(keys))
	}
	if got := sum(second, func(r topRow) float64 { return val(r.OpsPerSecond) }); got <= 0 {
		t.Errorf("ops/s %v after %d pushes", got, pushes)
	}
	if got := sum(second, func(r topRow) float64 { return val(r.InGBPerSecond) }); got <= 0 {
		t.Errorf("in GB/s %v after %d pushes", got, pushes)
	}
	home := -1 // the server that holds w
	for i, r := range second.Servers {
		if r.ParameterBlocks == 1 {
			home = i
		}
	}
	if home < 0 || second.Servers[home].P99Seconds == nil || *second.Servers[home].P99Seconds <= 0 ||
		*second.Servers[home].P99Seconds > 60 {
		t.Errorf("p99 of the server holding w: %+v", second.Servers)
	}

	// The table view: the columns, a row per server, once.
	code, out, errs := psctl(t, "top", "-servers", strings.Join(servers, ","), "-metrics", strings.Join(metrics, ","),
		"-n", "1", "-interval", "1ms", "-o", "wide")
	if code != 0 || !regexp.MustCompile(`INDEX\s+ADDRESS\s+HEALTH\s+OPS/S\s+REQ/S\s+IN GB/S\s+OUT GB/S\s+P99\s+ROWS\s+CLOCK LAG\s+BLOCKS\s+GRADIENTS\s+GETS\s+METRICS\s+ERROR`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^0\s+`+servers[0]+`\s+SERVING\s`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^1\s+`+servers[1]+`\s+SERVING\s`).MatchString(out) || strings.Contains(out, "\x1b[") {
		t.Fatalf("top -o wide: %d %q %q", code, out, errs)
	}
	// Without -metrics: the stats columns only, the others "-".
	code, out, _ = psctl(t, "top", "-servers", strings.Join(servers, ","), "-n", "1", "-interval", "1ms")
	if code != 0 || !regexp.MustCompile(`(?m)^0\s+`+servers[0]+`\s+SERVING\s+[0-9.]+\s+-\s+-\s+-\s+-\s+-\s+-`).MatchString(out) {
		t.Fatalf("top without -metrics: %d %q", code, out)
	}

	// tables, from the metrics pages.
	code, out, errs = psctl(t, "tables", "-metrics", metrics[1]+","+metrics[0], "-o", "json")
	var tables struct {
		Tables []tableJSON `json:"tables"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &tables) != nil || len(tables.Tables) != 1 || tables.Tables[0].Name != "emb" ||
		tables.Tables[0].Rows != float64(len(keys)) || tables.Tables[0].KeysPushed != float64(len(keys)) ||
		len(tables.Tables[0].Servers) != 2 || tables.Tables[0].Servers[0].Server != 0 {
		t.Fatalf("tables -o json: %d %q %q", code, out, errs)
	}
	code, out, _ = psctl(t, "tables", "-metrics", strings.Join(metrics, ","))
	if code != 0 || !regexp.MustCompile(fmt.Sprintf(`(?m)^emb\s+2\s+%d\s`, len(keys))).MatchString(out) {
		t.Fatalf("tables: %d %q", code, out)
	}
	// A metrics address that does not answer: listed on stderr, exit 3.
	if code, _, errs := psctl(t, "tables", "-metrics", metrics[0]+","+deadAddress(t)); code != 3 || !strings.Contains(errs, "metrics 127.0.0.1:") {
		t.Fatalf("tables with a dead metrics address: %d %q", code, errs)
	}
}

func TestDegradedReplicationFromTheMetricsPage(t *testing.T) {
	for _, c := range []struct {
		page, want string
	}{
		{"pserver_server_info{index=\"2\"} 1\npserver_replication_degraded 1\n", "shard 2 has no backup"},
		{"pserver_server_info{index=\"2\"} 1\npserver_replication_degraded 0\n", ""},
		{"pserver_server_info{index=\"2\"} 1\n", ""}, // no --accept_standbys
	} {
		page, err := parseMetrics(strings.NewReader(c.page))
		if err != nil {
			t.Fatal(err)
		}
		if got := page.degraded(2); got != c.want {
			t.Errorf("%q: degraded %q, want %q", c.page, got, c.want)
		}
		f := topFrame{Servers: []topRow{{Index: 2, Health: "SERVING", Degraded: page.degraded(2)}}}
		if f.degraded() != (c.want != "") {
			t.Errorf("%q: frame degraded %v", c.page, f.degraded())
		}
		var out strings.Builder
		if err := printTop(&out, &output{format: new(string)}, &f, false); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(out.String(), "degraded: "+c.want) != (c.want != "") {
			t.Errorf("%q: table %q", c.page, out.String())
		}
	}
}

func TestParseMetrics(t *testing.T) {
	page, err := parseMetrics(strings.NewReader(`# HELP x y
pserver_server_info{index="1",cluster="a \"b\"\\c"} 1
pserver_request_duration_seconds_bucket{method="Push",le="0.001"} 3
pserver_request_duration_seconds_bucket{method="Push",le="0.01"} 9
pserver_request_duration_seconds_bucket{method="Push",le="+Inf"} 10
pserver_request_duration_seconds_bucket{method="Read",le="0.001"} 0
pserver_request_duration_seconds_bucket{method="Read",le="0.01"} 0
pserver_request_duration_seconds_bucket{method="Read",le="+Inf"} 0
pserver_requests_total{method="Push"} 10 1700000000000
`))
	if err != nil {
		t.Fatal(err)
	}
	if i, ok := page.index(); !ok || i != 1 || page.samples[0].labels["cluster"] != `a "b"\c` {
		t.Fatalf("index %d %v, labels %q", i, ok, page.samples[0].labels)
	}
	if v, ok := quantile(nil, page, "pserver_request_duration_seconds", 0.5); !ok || v != 0.01 {
		t.Errorf("p50 %v %v, want 0.01", v, ok)
	}
	if v, ok := quantile(nil, page, "pserver_request_duration_seconds", 0.99); !ok || v != 0.01 {
		t.Errorf("p99 past the last finite bound: %v %v, want 0.01", v, ok)
	}
	if _, ok := quantile(page, page, "pserver_request_duration_seconds", 0.99); ok {
		t.Error("a quantile of nothing counted")
	}
	for _, bad := range []string{"x{a=\"1\" 2", "x y", "{a=\"1\"} 2", "x{a} 1", "x " + strings.Repeat("1", 2<<20)} {
		if _, err := parseMetrics(strings.NewReader(bad)); err == nil {
			t.Errorf("parsed %q", bad)
		}
	}
}
