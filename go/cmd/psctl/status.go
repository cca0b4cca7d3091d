package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pserver-project/pserver/go/pserver"
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

func cmdStatus(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("status", "status -etcd HOST:PORT[,...] [-cluster NAME] | -servers A,B", stdout, stderr)
	etcdFlag := fs.String("etcd", "", "etcd endpoints host:port[,host:port...]")
	cluster := fs.String("cluster", "default", "cluster name: keys live under /pserver/<cluster>")
	servers := fs.String("servers", "", "instead of etcd: ask these servers for their stats")
	timeout := fs.Duration("timeout", 10*time.Second, "deadline")
	auth := addSecurityFlags(fs)
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	switch {
	case *etcdFlag != "":
		e, err := newEtcdTLS(splitList(*etcdFlag), *timeout, auth.etcdTLS())
		if err != nil {
			return err
		}
		defer e.Close()
		return etcdStatus(ctx, e, *cluster, *auth.requireInstanceID, stdout)
	case *servers != "":
		opts, err := auth.clientOptions(pserver.Options{Servers: splitList(*servers), Timeout: *timeout})
		if err != nil {
			return err
		}
		return serverStatus(ctx, opts, stdout)
	default:
		fs.Usage()
		return errUsage
	}
}

// etcdStatus prints the cluster's registry. With requireInstanceID a
// /ps/<idx> entry that names no server instance is an error naming its key
// (after the listing), as a client with RequireInstanceID would refuse it.
func etcdStatus(ctx context.Context, e *etcd, cluster string, requireInstanceID bool, stdout io.Writer) error {
	keys := pserver.Keys(cluster)
	kvs, err := e.rangePrefix(ctx, keys.Prefix())
	if err != nil {
		return err
	}
	desired := "(unset)"
	servers := map[int]string{}
	checkpoints := map[int]checkpointRecord{}
	var workers []workerInfo
	var bare []string
	for _, kv := range kvs {
		key, err := keys.Parse(kv.key)
		if err != nil {
			continue // not of the layout: not pserver's
		}
		switch key.Kind {
		case pserver.KeyDesired:
			desired = kv.value
		case pserver.KeyServer:
			// "host:port instance=<id>" (or a bare "host:port"): the address.
			servers[key.Index] = strings.SplitN(kv.value, " ", 2)[0]
			if !strings.Contains(kv.value, " instance=") {
				bare = append(bare, fmt.Sprintf("%s is %q", kv.key, kv.value))
			}
		case pserver.KeyCheckpoint:
			var rec checkpointRecord
			if json.Unmarshal([]byte(kv.value), &rec) == nil {
				checkpoints[key.Index] = rec
			}
		case pserver.KeyWorker:
			var w workerInfo
			if json.Unmarshal([]byte(kv.value), &w) == nil {
				workers = append(workers, w)
			}
		}
	}
	fmt.Fprintf(stdout, "cluster %q: desired servers %s, live %d, workers %d\n\n", cluster, desired, len(servers), len(workers))
	n, _ := strconv.Atoi(desired)
	indexes := map[int]bool{}
	for i := 0; i < n; i++ {
		indexes[i] = true
	}
	for i := range servers {
		indexes[i] = true
	}
	for i := range checkpoints {
		indexes[i] = true
	}
	var order []int
	for i := range indexes {
		order = append(order, i)
	}
	sort.Ints(order)
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "INDEX\tADDRESS\tCHECKPOINT\tSEQUENCE\tWRITTEN")
	for _, i := range order {
		addr, ok := servers[i]
		if !ok {
			addr = "(down)"
		}
		rec, ok := checkpoints[i]
		path, seq, when := "-", "-", "-"
		if ok {
			path, seq, when = rec.Path, rec.Sequence, micros(rec.TimeMicros)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", i, addr, path, seq, when)
	}
	tw.Flush()
	if len(workers) > 0 {
		fmt.Fprintln(stdout)
		tw = tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "WORKER\tHOST\tPID\tSTARTED")
		for _, w := range workers {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", w.ID, w.Host, w.Pid, micros(w.StartTimeMicros))
		}
		tw.Flush()
	}
	if requireInstanceID && len(bare) > 0 {
		return fmt.Errorf("etcd %s, which names no server instance ('host:port instance=<id>', as a server writes it): "+
			"a rogue or hand-written registry entry (-require_instance_id)", strings.Join(bare, ", "))
	}
	return nil
}

// cmdHealth prints every server's gRPC health; an error unless all serve.
func cmdHealth(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("health", "health -etcd HOST:PORT[,...] [-cluster NAME] | -servers A,B", stdout, stderr)
	etcdFlag := fs.String("etcd", "", "etcd endpoints host:port[,host:port...]: find the servers there")
	cluster := fs.String("cluster", "default", "cluster name: keys live under /pserver/<cluster>")
	servers := fs.String("servers", "", "instead of etcd: these server addresses, in index order")
	timeout := fs.Duration("timeout", 10*time.Second, "deadline")
	auth := addSecurityFlags(fs)
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	if (*etcdFlag == "") == (*servers == "") {
		fs.Usage()
		return errUsage
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	client, err := auth.newClient(ctx, pserver.Options{Servers: splitList(*servers), Etcd: *etcdFlag,
		Cluster: *cluster, Timeout: *timeout})
	if err != nil {
		return err
	}
	defer client.Close()
	health, err := client.Health(ctx)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "INDEX\tADDRESS\tHEALTH")
	addresses := client.Servers()
	serving := 0
	for i, h := range health {
		address := ""
		if i < len(addresses) {
			address = addresses[i]
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\n", i, address, h)
		if h == "SERVING" {
			serving++
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if serving != len(health) {
		return fmt.Errorf("%d of %d servers are not SERVING", len(health)-serving, len(health))
	}
	return nil
}

func serverStatus(ctx context.Context, options pserver.Options, stdout io.Writer) error {
	client, err := pserver.NewClient(ctx, options)
	if err != nil {
		return err
	}
	defer client.Close()
	stats, err := client.Stats(ctx)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "INDEX\tADDRESS\tINITIALIZED\tBLOCKS\tBYTES\tSTATE BYTES\tGRADIENTS\tGETS\tREJECTED\tUPTIME")
	for i, s := range stats {
		fmt.Fprintf(tw, "%d\t%s\t%v\t%d\t%d\t%d\t%d\t%d\t%d\t%s\n", s.Index, options.Servers[i], s.Initialized, s.Parameters,
			s.ParameterBytes, s.OptimizerStateBytes, s.GradientsApplied, s.GetsServed, s.RequestsRejected,
			s.Uptime.Round(time.Second))
	}
	return tw.Flush()
}
