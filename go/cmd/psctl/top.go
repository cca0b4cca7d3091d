package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// topRow is one server in one refresh of psctl top (-o json: stable names,
// docs/operations.md). Rates are over the refresh's interval; a field from
// the metrics page is null for a server whose page psctl does not know
// (-metrics, or with -etcd the metrics= its /ps/<idx> value publishes).
type topRow struct {
	Index             int      `json:"index"`
	Address           string   `json:"address"`
	Health            string   `json:"health"`
	Error             string   `json:"error,omitempty"`
	Initialized       bool     `json:"initialized"`
	ParameterBlocks   uint64   `json:"parameter_blocks"`
	GradientsApplied  uint64   `json:"gradients_applied"`
	GetsServed        uint64   `json:"gets_served"`
	OpsPerSecond      *float64 `json:"ops_per_second"` // (gradients applied + blocks read) per second
	MetricsAddress    string   `json:"metrics_address,omitempty"`
	RequestsTotal     *float64 `json:"requests_total"`
	RequestsPerSecond *float64 `json:"requests_per_second"`
	ReceivedBytes     *float64 `json:"received_bytes_total"`
	SentBytes         *float64 `json:"sent_bytes_total"`
	InGBPerSecond     *float64 `json:"in_gb_per_second"`
	OutGBPerSecond    *float64 `json:"out_gb_per_second"`
	P99Seconds        *float64 `json:"p99_seconds"` // upper bound of the bucket; null: no request in the interval
	TableRows         *float64 `json:"table_rows"`
	ClockLagMax       *float64 `json:"clock_lag_max"`      // the most clocks any worker is behind, over tables
	Degraded          string   `json:"degraded,omitempty"` // e.g. "shard 0 has no backup" (from the metrics page)
}

// topFrame is one refresh.
type topFrame struct {
	Time            string   `json:"time"`
	Refresh         int      `json:"refresh"`
	IntervalSeconds float64  `json:"interval_seconds"`
	Servers         []topRow `json:"servers"`
}

// topSample is what one look at the cluster found.
type topSample struct {
	at      time.Time
	view    *view
	pages   map[int]*metricsPage // by server index
	pageErr []error
}

func takeSample(t *target, metrics []string) (*topSample, error) {
	ctx, cancel := context.WithTimeout(context.Background(), *t.timeout)
	defer cancel()
	v, err := t.resolve(ctx)
	if err != nil {
		return nil, err
	}
	s := &topSample{at: time.Now(), view: v, pages: map[int]*metricsPage{}}
	if len(metrics) == 0 && v.Reg != nil {
		metrics = v.Reg.metricsAddresses() // as the servers published them
	}
	pages, errs := fetchAllMetrics(ctx, metrics)
	for i, p := range pages {
		if errs[i] != nil {
			s.pageErr = append(s.pageErr, errs[i])
			continue
		}
		if index, ok := p.index(); ok {
			s.pages[index] = p
		} else {
			s.pageErr = append(s.pageErr, fmt.Errorf("metrics %s: no pserver_server_info: not a pserver", p.address))
		}
	}
	return s, nil
}

func rate(now, before, seconds float64) *float64 {
	if seconds <= 0 {
		return nil
	}
	r := (now - before) / seconds
	if r < 0 { // a restarted server
		r = 0
	}
	return &r
}

func some(v float64, ok bool) *float64 {
	if !ok {
		return nil
	}
	return &v
}

// frame is the rows of cur, with rates since prev.
func frame(prev, cur *topSample, refresh int) topFrame {
	dt := cur.at.Sub(prev.at).Seconds()
	f := topFrame{Time: cur.at.UTC().Format(time.RFC3339Nano), Refresh: refresh, IntervalSeconds: dt}
	before := map[string]*server{}
	for i := range prev.view.Servers {
		before[prev.view.Servers[i].Address] = &prev.view.Servers[i]
	}
	for _, s := range cur.view.Servers {
		row := topRow{Index: s.Index, Address: s.Address, Health: s.Health, Error: s.Error}
		if s.ServerStatsJSON != nil {
			row.Initialized = s.Initialized
			row.ParameterBlocks = s.ParameterBlocks
			row.GradientsApplied = s.GradientsApplied
			row.GetsServed = s.GetsServed
			if b := before[s.Address]; b != nil && b.ServerStatsJSON != nil && b.Index == s.Index {
				row.OpsPerSecond = rate(float64(s.GradientsApplied+s.GetsServed),
					float64(b.GradientsApplied+b.GetsServed), dt)
			}
		}
		if p := cur.pages[s.Index]; p != nil && s.Index >= 0 {
			old := prev.pages[s.Index]
			row.MetricsAddress = p.address
			row.Degraded = p.degraded(s.Index)
			row.RequestsTotal = some(p.sum("pserver_requests_total"))
			row.ReceivedBytes = some(p.sum("pserver_request_received_bytes_total"))
			row.SentBytes = some(p.sum("pserver_request_sent_bytes_total"))
			rows, _ := p.sum("pserver_table_rows") // 0 without tables
			row.TableRows = &rows
			row.ClockLagMax = some(p.max("pserver_table_worker_clock_lag"))
			if old != nil {
				perSecond := func(name string, scale float64) *float64 {
					now, _ := p.sum(name)
					then, _ := old.sum(name)
					r := rate(now/scale, then/scale, dt)
					return r
				}
				row.RequestsPerSecond = perSecond("pserver_requests_total", 1)
				row.InGBPerSecond = perSecond("pserver_request_received_bytes_total", 1e9)
				row.OutGBPerSecond = perSecond("pserver_request_sent_bytes_total", 1e9)
				row.P99Seconds = some(quantile(old, p, "pserver_request_duration_seconds", 0.99))
			}
		}
		f.Servers = append(f.Servers, row)
	}
	return f
}

func (f *topFrame) degraded() bool {
	for _, r := range f.Servers {
		if r.Health != "SERVING" || r.Degraded != "" {
			return true
		}
	}
	return false
}

func cmdTop(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("top", "top (-etcd HOST:PORT [-cluster NAME] | -servers A,B) [-metrics M1,M2] [-n COUNT] [-interval D] [-o table|wide|json]", stdout, stderr)
	t := addTarget(fs, true)
	count := fs.Int("n", 0, "refreshes before exiting; 0: until Ctrl-C")
	interval := fs.Duration("interval", 2*time.Second, "time between refreshes (a line on stdin refreshes at once)")
	out := addOutput(fs)
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	if err := out.check(); err != nil {
		return err
	}
	if err := t.check(); err != nil {
		return err
	}
	if *count < 0 || *interval <= 0 || fs.NArg() != 0 {
		return usageError("-n must be 0 or more, -interval positive, and top takes no arguments")
	}
	metrics := splitList(*t.metrics)
	prev, err := takeSample(t, metrics)
	if err != nil {
		return err
	}
	for _, e := range prev.pageErr {
		fmt.Fprintf(stderr, "psctl top: %v\n", e)
	}
	// A line on stdin asks for a refresh now (Enter on a terminal; scripts
	// and tests refresh exactly when they want).
	lines := make(chan struct{})
	done := make(chan struct{})
	defer close(done)
	go func() {
		sc := bufio.NewScanner(stdin)
		for sc.Scan() {
			select {
			case lines <- struct{}{}:
			case <-done:
				return
			}
		}
	}()
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(signals)
	clear := !out.json() && isTerminal(stdout)
	degraded := false
	for refresh := 1; *count == 0 || refresh <= *count; refresh++ {
		timer := time.NewTimer(*interval)
		select {
		case <-timer.C:
		case <-lines:
		case <-signals:
			timer.Stop()
			return nil
		}
		timer.Stop()
		cur, err := takeSample(t, metrics)
		if err != nil {
			return err
		}
		f := frame(prev, cur, refresh)
		degraded = degraded || f.degraded()
		if err := printTop(stdout, out, &f, clear); err != nil {
			return err
		}
		prev = cur
	}
	if degraded {
		return errDegraded
	}
	return nil
}

func orDash(v *float64, format string) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf(format, *v)
}

func printTop(stdout io.Writer, out *output, f *topFrame, clear bool) error {
	if out.json() {
		return writeJSON(stdout, f)
	}
	if clear {
		fmt.Fprint(stdout, "\x1b[H\x1b[2J") // home, clear screen
	} else if f.Refresh > 1 {
		fmt.Fprintln(stdout)
	}
	fmt.Fprintf(stdout, "psctl top  %s  refresh %d, rates over %.1f s\n", f.Time, f.Refresh, f.IntervalSeconds)
	header := []string{"INDEX", "ADDRESS", "HEALTH", "OPS/S", "REQ/S", "IN GB/S", "OUT GB/S", "P99", "ROWS", "CLOCK LAG"}
	if out.wide() {
		header = append(header, "BLOCKS", "GRADIENTS", "GETS", "METRICS", "ERROR")
	}
	t := newTable(stdout, header...)
	for _, r := range f.Servers {
		p99 := "-"
		if r.P99Seconds != nil {
			p99 = (time.Duration(*r.P99Seconds * float64(time.Second))).String()
		}
		cells := []interface{}{r.Index, orEmpty(r.Address), r.Health, orDash(r.OpsPerSecond, "%.1f"),
			orDash(r.RequestsPerSecond, "%.1f"), orDash(r.InGBPerSecond, "%.3f"), orDash(r.OutGBPerSecond, "%.3f"),
			p99, orDash(r.TableRows, "%.0f"), orDash(r.ClockLagMax, "%.0f")}
		if out.wide() {
			cells = append(cells, r.ParameterBlocks, r.GradientsApplied, r.GetsServed, orEmpty(r.MetricsAddress), orEmpty(r.Error))
		}
		t.row(cells...)
	}
	if err := t.flush(); err != nil {
		return err
	}
	printDegraded(stdout, f.Servers, func(r topRow) (int, string) { return r.Index, r.Degraded })
	return nil
}

// printDegraded lists the rows whose server says it is degraded.
func printDegraded[R any](stdout io.Writer, rows []R, reason func(R) (int, string)) {
	for _, r := range rows {
		if index, why := reason(r); why != "" {
			fmt.Fprintf(stdout, "server %d degraded: %s\n", index, why)
		}
	}
}

func orEmpty(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
