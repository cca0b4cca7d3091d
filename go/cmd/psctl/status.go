package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"time"
)

// checkpointRecord is pserver.v1.CheckpointRecord as protobuf JSON.
type checkpointRecord struct {
	Path           string `json:"path"`
	Shard          uint32 `json:"shard"`
	Sequence       string `json:"sequence"`
	ManifestCrc32c uint32 `json:"manifestCrc32c"`
	TimeMicros     string `json:"timeMicros"`
	ServerAddress  string `json:"serverAddress"`
}

// workerInfo is pserver.v1.WorkerInfo as protobuf JSON.
type workerInfo struct {
	ID              string `json:"id"`
	Host            string `json:"host"`
	Pid             string `json:"pid"`
	StartTimeMicros string `json:"startTimeMicros"`
}

func micros(s string) string {
	us, err := strconv.ParseInt(s, 10, 64)
	if err != nil || us == 0 {
		return "-"
	}
	return time.UnixMicro(us).UTC().Format("2006-01-02 15:04:05Z")
}

// checkpointJSON is a server's newest published checkpoint (etcd /checkpoints/<idx>).
type checkpointJSON struct {
	Path     string `json:"path"`
	Sequence string `json:"sequence"`
	Written  string `json:"written"`
}

// statusServer is a row of psctl status.
type statusServer struct {
	server
	Checkpoint *checkpointJSON `json:"checkpoint,omitempty"`
	// Why the server is degraded though serving (from its metrics page, with
	// etcd): e.g. "shard 0 has no backup".
	Degraded string `json:"degraded,omitempty"`
	// Backups of the shard its configuration lists (etcd /shards/<idx>; with
	// etcd only; absent: no configuration).
	Backups *int `json:"backups,omitempty"`
}

// workerJSON is a live trainer (etcd /workers/<id>).
type workerJSON struct {
	ID      string `json:"id"`
	Host    string `json:"host"`
	Pid     string `json:"pid"`
	Started string `json:"started"`
}

// statusJSON is psctl status -o json.
type statusJSON struct {
	Source   string         `json:"source"` // "etcd" or "servers"
	Cluster  string         `json:"cluster,omitempty"`
	Desired  string         `json:"desired,omitempty"` // /ps_desired as stored
	Live     int            `json:"live"`              // servers registered (etcd) or answering (-servers)
	Degraded bool           `json:"degraded"`
	Servers  []statusServer `json:"servers"`
	Workers  []workerJSON   `json:"workers"`
}

func cmdStatus(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("status", "status (-etcd HOST:PORT[,...] [-cluster NAME] | -servers A,B) [-o table|wide|json]", stdout, stderr)
	t := addTarget(fs, false)
	out := addOutput(fs)
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	if err := firstError(out.check(), t.check(), noArgs(fs)); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), *t.timeout)
	defer cancel()
	v, err := t.resolve(ctx)
	if err != nil {
		return err
	}
	st := statusJSON{Source: v.Source, Degraded: v.degraded(), Workers: []workerJSON{}}
	for _, s := range v.Servers {
		row := statusServer{server: s}
		if v.Reg != nil {
			if rec, ok := v.Reg.Checkpoints[s.Index]; ok {
				row.Checkpoint = &checkpointJSON{rec.Path, rec.Sequence, micros(rec.TimeMicros)}
			}
			if backups, ok := v.Reg.Backups[s.Index]; ok {
				row.Backups = &backups
			}
		}
		if s.Index >= 0 { // answered (-servers); with etcd, replaced below
			st.Live++
		}
		st.Servers = append(st.Servers, row)
	}
	if v.Reg != nil {
		st.Cluster, st.Desired = *t.cluster, v.Reg.DesiredRaw
		st.Live = len(v.Reg.Servers)
		// Checkpoints of indexes past the servers listed (a shrunk cluster).
		for i, rec := range v.Reg.Checkpoints {
			if i >= len(st.Servers) {
				st.Servers = append(st.Servers, statusServer{server: server{Index: i, Health: healthDown},
					Checkpoint: &checkpointJSON{rec.Path, rec.Sequence, micros(rec.TimeMicros)}})
			}
		}
		pages, _ := fetchAllMetrics(ctx, v.Reg.metricsAddresses())
		for _, p := range pages {
			index, ok := -1, false
			if p != nil {
				index, ok = p.index()
			}
			for i := range st.Servers {
				if ok && st.Servers[i].Index == index {
					st.Servers[i].Degraded = p.degraded(index)
					st.Degraded = st.Degraded || st.Servers[i].Degraded != ""
				}
			}
		}
		for _, w := range v.Reg.Workers {
			st.Workers = append(st.Workers, workerJSON{w.ID, w.Host, w.Pid, micros(w.StartTimeMicros)})
		}
	}
	if err := printStatus(stdout, out, &st); err != nil {
		return err
	}
	if v.Reg != nil && *t.auth.requireInstanceID && len(v.Reg.Bare) > 0 {
		return bareError(v.Reg.Bare)
	}
	if st.Degraded {
		return errDegraded
	}
	return nil
}

func printStatus(stdout io.Writer, out *output, st *statusJSON) error {
	if out.json() {
		return writeJSON(stdout, st)
	}
	if st.Source == "etcd" {
		desired := st.Desired
		if desired == "" {
			desired = "(unset)"
		}
		fmt.Fprintf(stdout, "cluster %q: desired servers %s, live %d, workers %d\n\n", st.Cluster, desired, st.Live, len(st.Workers))
	} else {
		fmt.Fprintf(stdout, "servers: %d of %d answer\n\n", st.Live, len(st.Servers))
	}
	header := []string{"INDEX", "ADDRESS", "HEALTH", "INITIALIZED", "BLOCKS", "BYTES", "GRADIENTS", "GETS", "UPTIME"}
	if st.Source == "etcd" {
		header = append(header, "BACKUPS", "CHECKPOINT", "SEQUENCE")
	}
	if out.wide() {
		header = append(header, "STATE BYTES", "REJECTED", "WRITTEN", "INSTANCE", "ERROR")
	}
	tw := newTable(stdout, header...)
	for _, s := range st.Servers {
		address := s.Address
		if address == "" {
			address = "(down)"
		}
		cells := []interface{}{s.Index, address, s.Health}
		if s.ServerStatsJSON != nil {
			cells = append(cells, s.Initialized, s.ParameterBlocks, s.ParameterBytes, s.GradientsApplied, s.GetsServed,
				(time.Duration(s.UptimeSeconds) * time.Second).String())
		} else {
			cells = append(cells, "-", "-", "-", "-", "-", "-")
		}
		ck := &checkpointJSON{"-", "-", "-"}
		if s.Checkpoint != nil {
			ck = s.Checkpoint
		}
		if st.Source == "etcd" {
			backups := "-"
			if s.Backups != nil {
				backups = strconv.Itoa(*s.Backups)
			}
			cells = append(cells, backups, ck.Path, ck.Sequence)
		}
		if out.wide() {
			if s.ServerStatsJSON != nil {
				cells = append(cells, s.OptimizerStateBytes, s.RequestsRejected)
			} else {
				cells = append(cells, "-", "-")
			}
			cells = append(cells, ck.Written, orEmpty(s.Instance), orEmpty(s.Error))
		}
		tw.row(cells...)
	}
	tw.flush()
	if len(st.Workers) > 0 {
		fmt.Fprintln(stdout)
		tw = newTable(stdout, "WORKER", "HOST", "PID", "STARTED")
		for _, w := range st.Workers {
			tw.row(w.ID, w.Host, w.Pid, w.Started)
		}
		tw.flush()
	}
	printDegraded(stdout, st.Servers, func(s statusServer) (int, string) { return s.Index, s.Degraded })
	if !out.wide() {
		sep := "\n"
		for _, s := range st.Servers {
			if s.Error != "" && s.Health != healthDown {
				fmt.Fprintf(stdout, "%sserver %d %s: %s\n", sep, s.Index, orEmpty(s.Address), s.Error)
				sep = ""
			}
		}
	}
	return nil
}

// healthJSON is psctl health -o json.
type healthJSON struct {
	Servers []healthRow `json:"servers"`
}

type healthRow struct {
	Index   int    `json:"index"`
	Address string `json:"address"`
	Health  string `json:"health"`
	Error   string `json:"error,omitempty"`
}

// cmdHealth prints every server's gRPC health; degraded unless all serve.
func cmdHealth(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("health", "health (-etcd HOST:PORT[,...] [-cluster NAME] | -servers A,B) [-o table|wide|json]", stdout, stderr)
	t := addTarget(fs, false)
	out := addOutput(fs)
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	if err := firstError(out.check(), t.check(), noArgs(fs)); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), *t.timeout)
	defer cancel()
	v, err := t.resolve(ctx)
	if err != nil {
		return err
	}
	h := healthJSON{Servers: []healthRow{}}
	for _, s := range v.Servers {
		h.Servers = append(h.Servers, healthRow{s.Index, s.Address, s.Health, s.Error})
	}
	if out.json() {
		err = writeJSON(stdout, h)
	} else {
		header := []string{"INDEX", "ADDRESS", "HEALTH"}
		if out.wide() {
			header = append(header, "ERROR")
		}
		tw := newTable(stdout, header...)
		for _, r := range h.Servers {
			cells := []interface{}{r.Index, orEmpty(r.Address), r.Health}
			if out.wide() {
				cells = append(cells, orEmpty(r.Error))
			}
			tw.row(cells...)
		}
		err = tw.flush()
	}
	if err != nil {
		return err
	}
	if v.degraded() {
		bad := 0
		for _, s := range v.Servers {
			if !s.ok() {
				bad++
			}
		}
		fmt.Fprintf(stderr, "psctl health: %d of %d servers are not SERVING\n", bad, len(v.Servers))
		return errDegraded
	}
	return nil
}
