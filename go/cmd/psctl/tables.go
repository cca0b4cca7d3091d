package main

import (
	"context"
	"fmt"
	"io"
	"sort"
)

// tableJSON is a table over all servers (psctl tables -o json).
type tableJSON struct {
	Name string `json:"name"`
	tableCounts
	Servers []tableMetrics `json:"servers"`
}

func cmdTables(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("tables", "tables (-etcd HOST:PORT [-cluster NAME] | -metrics A,B) [-o table|wide|json]", stdout, stderr)
	t := addTarget(fs, true)
	out := addOutput(fs)
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	if err := out.check(); err != nil {
		return err
	}
	if (*t.metrics == "" && *t.etcd == "") || *t.servers != "" || fs.NArg() != 0 {
		return usageError("tables reads the servers' metrics pages: give -etcd HOST:PORT (the pages the servers " +
			"published there) or -metrics HOST:PORT,... (pserver --metrics_port)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), *t.timeout)
	defer cancel()
	metrics := splitList(*t.metrics)
	if len(metrics) == 0 {
		reg, err := t.registry(ctx)
		if err != nil {
			return err
		}
		if metrics = reg.metricsAddresses(); len(metrics) == 0 {
			return fmt.Errorf("no server in etcd cluster %q publishes a metrics page (pserver --metrics_port): "+
				"give -metrics HOST:PORT,...", *t.cluster)
		}
	}
	pages, errs := fetchAllMetrics(ctx, metrics)
	var failed []error
	byName := map[string]*tableJSON{}
	for i, p := range pages {
		if errs[i] != nil {
			failed = append(failed, errs[i])
			continue
		}
		for _, t := range p.tables() {
			agg := byName[t.Name]
			if agg == nil {
				agg = &tableJSON{Name: t.Name}
				byName[t.Name] = agg
			}
			agg.add(t.tableCounts)
			agg.Servers = append(agg.Servers, t)
		}
	}
	all := make([]tableJSON, 0, len(byName))
	for _, t := range byName {
		sort.Slice(t.Servers, func(a, b int) bool { return t.Servers[a].Server < t.Servers[b].Server })
		all = append(all, *t)
	}
	sort.Slice(all, func(a, b int) bool { return all[a].Name < all[b].Name })
	if err := printTables(stdout, out, all, failed); err != nil {
		return err
	}
	if len(failed) > 0 {
		for _, err := range failed {
			fmt.Fprintf(stderr, "psctl tables: %v\n", err)
		}
		return errDegraded
	}
	return nil
}

func printTables(stdout io.Writer, out *output, all []tableJSON, failed []error) error {
	if out.json() {
		errs := make([]string, 0, len(failed))
		for _, e := range failed {
			errs = append(errs, e.Error())
		}
		return writeJSON(stdout, map[string]interface{}{"tables": all, "errors": errs})
	}
	if out.wide() {
		t := newTable(stdout, "TABLE", "SERVER", "ROWS", "BYTES", "EVICTIONS", "PENDING", "PULLED", "PUSHED", "WORKERS", "MIN CLOCK")
		for _, a := range all {
			for _, s := range a.Servers {
				t.row(s.Name, s.Server, s.Rows, s.Bytes, s.Evictions, s.PendingKeys, s.KeysPulled, s.KeysPushed, s.Workers, s.MinClock)
			}
		}
		return t.flush()
	}
	t := newTable(stdout, "TABLE", "SERVERS", "ROWS", "BYTES", "EVICTIONS", "PENDING", "PULLED", "PUSHED")
	for _, a := range all {
		t.row(a.Name, len(a.Servers), a.Rows, a.Bytes, a.Evictions, a.PendingKeys, a.KeysPulled, a.KeysPushed)
	}
	return t.flush()
}
