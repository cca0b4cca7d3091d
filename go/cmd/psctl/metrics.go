package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
)

// maxMetricsPage bounds what psctl reads of one /metrics page.
const maxMetricsPage = 16 << 20

// metric is one sample line of Prometheus's text format.
type metric struct {
	name   string
	labels map[string]string
	value  float64
}

// metricsPage is a server's /metrics page (--metrics_port).
type metricsPage struct {
	address string
	samples []metric
}

// metricsURL accepts host:port or a full http:// URL.
func metricsURL(address string) string {
	if strings.HasPrefix(address, "http://") || strings.HasPrefix(address, "https://") {
		return address
	}
	return "http://" + address + "/metrics"
}

// fetchMetrics reads and parses address's /metrics page.
func fetchMetrics(ctx context.Context, address string) (*metricsPage, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, metricsURL(address), nil)
	if err != nil {
		return nil, fmt.Errorf("metrics %s: %w", address, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("metrics %s: %w", address, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("metrics %s: HTTP %s", address, resp.Status)
	}
	page, err := parseMetrics(io.LimitReader(resp.Body, maxMetricsPage))
	if err != nil {
		return nil, fmt.Errorf("metrics %s: %w", address, err)
	}
	page.address = address
	return page, nil
}

// parseMetrics parses the sample lines of Prometheus's text format 0.0.4
// (comments skipped; a timestamp after the value ignored).
func parseMetrics(r io.Reader) (*metricsPage, error) {
	page := &metricsPage{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || text[0] == '#' {
			continue
		}
		m, err := parseMetricLine(text)
		if err != nil {
			return nil, fmt.Errorf("line %d: %v", line, err)
		}
		page.samples = append(page.samples, m)
	}
	return page, sc.Err()
}

func parseMetricLine(text string) (metric, error) {
	m := metric{labels: map[string]string{}}
	end := strings.IndexAny(text, "{ ")
	if end <= 0 {
		return m, fmt.Errorf("no value in %q", text)
	}
	m.name, text = text[:end], text[end:]
	if text[0] == '{' {
		text = text[1:]
		for {
			text = strings.TrimLeft(text, " ,")
			if strings.HasPrefix(text, "}") {
				text = text[1:]
				break
			}
			eq := strings.Index(text, "=\"")
			if eq <= 0 {
				return m, fmt.Errorf("bad labels in %q", text)
			}
			key := text[:eq]
			text = text[eq+2:]
			var b strings.Builder
			i := 0
			for ; i < len(text) && text[i] != '"'; i++ {
				if text[i] == '\\' && i+1 < len(text) {
					i++
					if text[i] == 'n' {
						b.WriteByte('\n')
						continue
					}
				}
				b.WriteByte(text[i])
			}
			if i == len(text) {
				return m, fmt.Errorf("unterminated label %s", key)
			}
			m.labels[key] = b.String()
			text = text[i+1:]
		}
	}
	fields := strings.Fields(text)
	if len(fields) == 0 {
		return m, fmt.Errorf("no value for %s", m.name)
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return m, fmt.Errorf("value of %s: %v", m.name, err)
	}
	m.value = v
	return m, nil
}

// sum is the sum of name's samples over all labels (0, false: none).
func (p *metricsPage) sum(name string) (float64, bool) {
	total, found := 0.0, false
	for _, m := range p.samples {
		if m.name == name {
			total += m.value
			found = true
		}
	}
	return total, found
}

// max is the largest of name's samples (false: none).
func (p *metricsPage) max(name string) (float64, bool) {
	best, found := math.Inf(-1), false
	for _, m := range p.samples {
		if m.name == name && m.value > best {
			best, found = m.value, true
		}
	}
	return best, found
}

// degraded is why the server of shard `index` is degraded, from its
// replication health (pserver_replication_degraded, docs/replication.md);
// "": not degraded.
func (p *metricsPage) degraded(index int) string {
	if v, ok := p.max("pserver_replication_degraded"); ok && v > 0 {
		return fmt.Sprintf("shard %d has no backup", index)
	}
	return ""
}

// index is the server's index from pserver_server_info (false: none).
func (p *metricsPage) index() (int, bool) {
	for _, m := range p.samples {
		if m.name == "pserver_server_info" {
			if i, err := strconv.Atoi(m.labels["index"]); err == nil {
				return i, true
			}
		}
	}
	return 0, false
}

// buckets is histogram name's cumulative bucket counts by upper bound,
// summed over its other labels.
func (p *metricsPage) buckets(name string) map[float64]float64 {
	out := map[float64]float64{}
	for _, m := range p.samples {
		if m.name != name+"_bucket" {
			continue
		}
		le, err := strconv.ParseFloat(m.labels["le"], 64)
		if err == nil {
			out[le] += m.value
		}
	}
	return out
}

// quantile is the upper bound of the bucket holding quantile q of what
// histogram name counted between pages prev and cur (prev nil: since the
// start); false when it counted nothing. Past the last finite bound it is
// that bound.
func quantile(prev, cur *metricsPage, name string, q float64) (float64, bool) {
	now := cur.buckets(name)
	var before map[float64]float64
	if prev != nil {
		before = prev.buckets(name)
	}
	bounds := make([]float64, 0, len(now))
	for le := range now {
		bounds = append(bounds, le)
	}
	sort.Float64s(bounds)
	if len(bounds) == 0 {
		return 0, false
	}
	total := now[bounds[len(bounds)-1]] - before[bounds[len(bounds)-1]]
	if total <= 0 {
		return 0, false
	}
	lastFinite := 0.0
	for _, le := range bounds {
		if math.IsInf(le, 1) {
			break
		}
		lastFinite = le
		if now[le]-before[le] >= q*total {
			return le, true
		}
	}
	return lastFinite, true
}

// tableMetrics is one sparse table on one server, from its metrics page.
type tableMetrics struct {
	Name   string `json:"name"`
	Server int    `json:"server"`
	tableCounts
	Workers  float64 `json:"workers"`
	MinClock float64 `json:"min_clock"`
}

// tableCounts are what a table holds and has served, on one server or summed.
type tableCounts struct {
	Rows        float64 `json:"rows"`
	Bytes       float64 `json:"bytes"`
	Evictions   float64 `json:"evictions"`
	PendingKeys float64 `json:"pending_keys"`
	KeysPulled  float64 `json:"keys_pulled"`
	KeysPushed  float64 `json:"keys_pushed"`
}

func (c *tableCounts) add(o tableCounts) {
	c.Rows += o.Rows
	c.Bytes += o.Bytes
	c.Evictions += o.Evictions
	c.PendingKeys += o.PendingKeys
	c.KeysPulled += o.KeysPulled
	c.KeysPushed += o.KeysPushed
}

// tables is every table on the page.
func (p *metricsPage) tables() []tableMetrics {
	index, _ := p.index()
	byName := map[string]*tableMetrics{}
	var order []string
	for _, m := range p.samples {
		name, ok := m.labels["table"]
		if !ok || !strings.HasPrefix(m.name, "pserver_table_") || m.labels["worker"] != "" {
			continue
		}
		t := byName[name]
		if t == nil {
			t = &tableMetrics{Name: name, Server: index, MinClock: -1}
			byName[name] = t
			order = append(order, name)
		}
		switch m.name {
		case "pserver_table_rows":
			t.Rows = m.value
		case "pserver_table_bytes":
			t.Bytes = m.value
		case "pserver_table_evictions_total":
			t.Evictions = m.value
		case "pserver_table_pending_keys":
			t.PendingKeys = m.value
		case "pserver_table_keys_pulled_total":
			t.KeysPulled = m.value
		case "pserver_table_keys_pushed_total":
			t.KeysPushed = m.value
		case "pserver_table_workers":
			t.Workers = m.value
		case "pserver_table_min_clock":
			t.MinClock = m.value
		}
	}
	out := make([]tableMetrics, 0, len(order))
	for _, n := range order {
		out = append(out, *byName[n])
	}
	return out
}

// fetchAllMetrics reads every page at once; a page that fails is an error
// in errs at the same position.
func fetchAllMetrics(ctx context.Context, addresses []string) ([]*metricsPage, []error) {
	pages := make([]*metricsPage, len(addresses))
	errs := make([]error, len(addresses))
	done := make(chan struct{}, len(addresses))
	for i, a := range addresses {
		go func(i int, a string) {
			pages[i], errs[i] = fetchMetrics(ctx, a)
			done <- struct{}{}
		}(i, a)
	}
	for range addresses {
		<-done
	}
	return pages, errs
}
