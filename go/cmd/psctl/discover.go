package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/pserver-project/pserver/go/pserver"
)

// Health values psctl reports besides grpc.health.v1's.
const (
	healthUnreachable = "UNREACHABLE" // registered or named, but did not answer
	healthDown        = "DOWN"        // an index below the desired count that no server holds
)

// registry is what etcd holds about a cluster.
type registry struct {
	Desired     int            // /ps_desired; 0: unset or not a number
	DesiredRaw  string         // as stored; "" when unset
	Servers     map[int]string // /ps/<idx>: address
	Instances   map[int]string // /ps/<idx>: instance id ("" for a bare entry)
	Bare        []string       // `key is "value"` of entries that name no instance
	Metrics     map[int]string // /ps/<idx>: the metrics page's address, when published
	Malformed   map[int]string // /ps/<idx>: why its value was refused
	Checkpoints map[int]checkpointRecord
	// /shards/<idx>: how many backups (standbys) the shard's configuration
	// lists (docs/replication.md); absent when the shard has no configuration.
	Backups map[int]int
	Workers []workerInfo
}

// shardConfig is pserver.v1.ShardConfig as protobuf JSON (the fields psctl reads).
type shardConfig struct {
	Holder   string   `json:"holder"`
	Replicas []string `json:"replicas"`
}

func readRegistry(ctx context.Context, e *etcd, cluster string) (*registry, error) {
	keys := pserver.Keys(cluster)
	kvs, err := e.rangePrefix(ctx, keys.Prefix())
	if err != nil {
		return nil, err
	}
	r := &registry{Servers: map[int]string{}, Instances: map[int]string{}, Metrics: map[int]string{},
		Malformed: map[int]string{}, Checkpoints: map[int]checkpointRecord{}, Backups: map[int]int{}}
	for _, kv := range kvs {
		key, err := keys.Parse(kv.key)
		if err != nil {
			continue // not of the layout: not pserver's
		}
		switch key.Kind {
		case pserver.KeyDesired:
			r.DesiredRaw = kv.value
			r.Desired, _ = strconv.Atoi(kv.value)
		case pserver.KeyServer:
			// "host:port instance=<id>[ metrics=host:port]" (or a bare "host:port").
			entry, err := pserver.ParseServerValue(kv.value)
			if err != nil {
				r.Malformed[key.Index] = fmt.Sprintf("etcd %s: %v", kv.key, err)
				continue
			}
			r.Servers[key.Index] = entry.Address
			if entry.InstanceID != "" {
				r.Instances[key.Index] = entry.InstanceID
			} else {
				r.Bare = append(r.Bare, fmt.Sprintf("%s is %q", kv.key, kv.value))
			}
			if entry.MetricsAddress != "" {
				r.Metrics[key.Index] = entry.MetricsAddress
			}
		case pserver.KeyCheckpoint:
			var rec checkpointRecord
			if json.Unmarshal([]byte(kv.value), &rec) == nil {
				r.Checkpoints[key.Index] = rec
			}
		case pserver.KeyShard:
			var config shardConfig
			if json.Unmarshal([]byte(kv.value), &config) == nil {
				r.Backups[key.Index] = len(config.Replicas)
			}
		case pserver.KeyWorker:
			var w workerInfo
			if json.Unmarshal([]byte(kv.value), &w) == nil {
				r.Workers = append(r.Workers, w)
			}
		}
	}
	return r, nil
}

// ServerStatsJSON is GetStats as psctl prints it.
type ServerStatsJSON struct {
	Initialized         bool    `json:"initialized"`
	ParameterBlocks     uint64  `json:"parameter_blocks"`
	ParameterBytes      uint64  `json:"parameter_bytes"`
	OptimizerStateBytes uint64  `json:"optimizer_state_bytes"`
	GradientsApplied    uint64  `json:"gradients_applied"`
	GetsServed          uint64  `json:"gets_served"`
	RequestsRejected    uint64  `json:"requests_rejected"`
	UptimeSeconds       float64 `json:"uptime_seconds"`
}

func statsJSON(s pserver.ServerStats) *ServerStatsJSON {
	return &ServerStatsJSON{s.Initialized, s.Parameters, s.ParameterBytes, s.OptimizerStateBytes,
		s.GradientsApplied, s.GetsServed, s.RequestsRejected, s.Uptime.Seconds()}
}

// server is one server of a cluster as psctl found it: a row of status,
// health and top.
type server struct {
	Index    int    `json:"index"`   // -1: unknown (a -servers address that did not answer)
	Address  string `json:"address"` // "": no server registered at this index
	Instance string `json:"instance,omitempty"`
	Health   string `json:"health"` // SERVING, NOT_SERVING, UNREACHABLE, DOWN, ...
	Error    string `json:"error,omitempty"`
	*ServerStatsJSON
}

func (s *server) ok() bool { return s.Health == "SERVING" }

// metricsAddresses is every published metrics page, in index order.
func (r *registry) metricsAddresses() []string {
	indexes := make([]int, 0, len(r.Metrics))
	for i := range r.Metrics {
		indexes = append(indexes, i)
	}
	sort.Ints(indexes)
	out := make([]string, 0, len(indexes))
	for _, i := range indexes {
		out = append(out, r.Metrics[i])
	}
	return out
}

// probe asks the server at address for its stats and health.
func probe(ctx context.Context, t *target, address string) server {
	row := server{Index: -1, Address: address, Health: healthUnreachable}
	// A refused connection is known at once; the client would retry it
	// until the deadline.
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", address)
	if err != nil {
		row.Error = err.Error()
		return row
	}
	conn.Close()
	opts, err := t.auth.clientOptions(pserver.Options{Servers: []string{address}, Timeout: *t.timeout})
	if err != nil {
		row.Error = err.Error()
		return row
	}
	client, err := pserver.NewClient(ctx, opts)
	if err != nil {
		row.Error = err.Error()
		return row
	}
	defer client.Close()
	stats, err := client.Stats(ctx)
	if err != nil || len(stats) != 1 {
		row.Error = fmt.Sprint(err)
		return row
	}
	row.Index = int(stats[0].Index)
	row.ServerStatsJSON = statsJSON(stats[0])
	health, err := client.Health(ctx)
	switch {
	case err != nil:
		row.Health, row.Error = "UNKNOWN", err.Error()
	case len(health) == 1:
		row.Health = health[0]
	}
	return row
}

// probeAll probes every address at once.
func probeAll(ctx context.Context, t *target, addresses []string) []server {
	rows := make([]server, len(addresses))
	var wg sync.WaitGroup
	for i, a := range addresses {
		wg.Add(1)
		go func(i int, a string) {
			defer wg.Done()
			rows[i] = probe(ctx, t, a)
		}(i, a)
	}
	wg.Wait()
	return rows
}

// view is a cluster as psctl found it: its servers in index order (those of
// unknown index last) and, with -etcd, its registry.
type view struct {
	Source  string // "etcd" or "servers"
	Reg     *registry
	Servers []server
}

// degraded: some server is down, unreachable or not serving.
func (v *view) degraded() bool {
	for _, s := range v.Servers {
		if !s.ok() {
			return true
		}
	}
	return false
}

// registry reads the cluster's keys from -etcd.
func (t *target) registry(ctx context.Context) (*registry, error) {
	e, err := newEtcdTLS(splitList(*t.etcd), *t.timeout, t.auth.etcdTLS())
	if err != nil {
		return nil, err
	}
	defer e.Close()
	return readRegistry(ctx, e, *t.cluster)
}

// resolve finds the cluster's servers (from etcd or -servers) and asks each
// for its stats and health; one that does not answer is a row, not an error.
func (t *target) resolve(ctx context.Context) (*view, error) {
	if *t.servers != "" {
		rows := probeAll(ctx, t, splitList(*t.servers))
		sortServers(rows)
		return &view{Source: "servers", Servers: rows}, nil
	}
	reg, err := t.registry(ctx)
	if err != nil {
		return nil, err
	}
	n := reg.Desired
	for i := range reg.Servers {
		if i+1 > n {
			n = i + 1
		}
	}
	for i := range reg.Malformed {
		if i+1 > n {
			n = i + 1
		}
	}
	var addresses []string
	var indexes []int
	for i := 0; i < n; i++ {
		if a, ok := reg.Servers[i]; ok {
			addresses = append(addresses, a)
			indexes = append(indexes, i)
		}
	}
	probed := probeAll(ctx, t, addresses)
	rows := make([]server, 0, n)
	for i := 0; i < n; i++ {
		if _, ok := reg.Servers[i]; !ok {
			why := "no server registered at this index"
			if m, bad := reg.Malformed[i]; bad {
				why = m
			}
			rows = append(rows, server{Index: i, Health: healthDown, Error: why})
		}
	}
	for j, row := range probed {
		i := indexes[j]
		if row.Index >= 0 && row.Index != i {
			row.Error = fmt.Sprintf("registered as %d, but the server says it is %d", i, row.Index)
			row.Health = "WRONG_INDEX"
		}
		row.Index = i
		row.Instance = reg.Instances[i]
		rows = append(rows, row)
	}
	sortServers(rows)
	return &view{Source: "etcd", Reg: reg, Servers: rows}, nil
}

func sortServers(rows []server) {
	sort.SliceStable(rows, func(a, b int) bool {
		ia, ib := rows[a].Index, rows[b].Index
		if (ia < 0) != (ib < 0) {
			return ia >= 0
		}
		if ia != ib {
			return ia < ib
		}
		return rows[a].Address < rows[b].Address
	})
}

// addresses is every server's address in index order, for a client of the
// whole cluster: an error naming the indexes missing or not answering.
func (v *view) addresses() ([]string, error) {
	var out, bad []string
	next := 0
	for _, s := range v.Servers {
		switch {
		case s.Index < 0:
			bad = append(bad, fmt.Sprintf("%s did not answer (%s)", s.Address, s.Error))
			continue
		case s.Index != next:
			bad = append(bad, fmt.Sprintf("index %d is missing or given twice", next))
		case s.Health == healthDown || s.Health == healthUnreachable:
			bad = append(bad, fmt.Sprintf("server %d %s is %s", s.Index, s.Address, s.Health))
		default:
			out = append(out, s.Address)
		}
		next = s.Index + 1
	}
	if len(bad) > 0 || len(out) == 0 {
		return nil, fmt.Errorf("the cluster is incomplete: %s", strings.Join(bad, "; "))
	}
	return out, nil
}

// client connects to every server of the cluster, in index order.
func (t *target) client(ctx context.Context) (*pserver.Client, error) {
	v, err := t.resolve(ctx)
	if err != nil {
		return nil, err
	}
	if v.Reg != nil && *t.auth.requireInstanceID && len(v.Reg.Bare) > 0 {
		return nil, bareError(v.Reg.Bare)
	}
	addresses, err := v.addresses()
	if err != nil {
		return nil, err
	}
	return t.auth.newClient(ctx, pserver.Options{Servers: addresses, Timeout: *t.timeout})
}

// bareError names registry entries that name no server instance.
func bareError(bare []string) error {
	return fmt.Errorf("etcd %s, which names no server instance ('host:port instance=<id>', as a server writes it): "+
		"a rogue or hand-written registry entry (-require_instance_id)", strings.Join(bare, ", "))
}
