package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// etcd is a minimal etcd v3 client over etcd's JSON gateway (/v3/kv/...),
// standard library only. pserver.h has no etcd calls, and psctl needs only
// a range read and a put.
type etcd struct {
	endpoints []string
	http      *http.Client
}

func newEtcd(endpoints []string) *etcd { return &etcd{endpoints: endpoints, http: &http.Client{}} }

func clusterPrefix(cluster string) string { return "/pserver/" + cluster + "/" }

type kv struct{ key, value string }

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// post sends a JSON request to the first endpoint that answers.
func (e *etcd) post(ctx context.Context, path string, req interface{}, resp interface{}) error {
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	var lastErr error
	for _, ep := range e.endpoints {
		url := ep
		if !strings.Contains(url, "://") {
			url = "http://" + url
		}
		r, err := http.NewRequestWithContext(ctx, http.MethodPost, url+path, bytes.NewReader(body))
		if err != nil {
			return err
		}
		r.Header.Set("Content-Type", "application/json")
		res, err := e.http.Do(r)
		if err != nil {
			lastErr = fmt.Errorf("etcd %s on %s: %w", path, ep, err)
			continue
		}
		data, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil {
			lastErr = fmt.Errorf("etcd %s on %s: %w", path, ep, err)
			continue
		}
		if res.StatusCode != http.StatusOK {
			return fmt.Errorf("etcd %s on %s: %s: %s", path, ep, res.Status, strings.TrimSpace(string(data)))
		}
		return json.Unmarshal(data, resp)
	}
	if lastErr == nil {
		lastErr = fmt.Errorf("no etcd endpoints")
	}
	return lastErr
}

// prefixEnd is the range_end that selects every key starting with prefix.
func prefixEnd(prefix string) string {
	b := []byte(prefix)
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] < 0xff {
			b[i]++
			return string(b[:i+1])
		}
	}
	return "\x00"
}

// rangePrefix is every key under prefix, sorted by key.
func (e *etcd) rangePrefix(ctx context.Context, prefix string) ([]kv, error) {
	var resp struct {
		Kvs []struct {
			Key   string `json:"key"`
			Value string `json:"value"`
		} `json:"kvs"`
	}
	req := map[string]interface{}{
		"key": b64(prefix), "range_end": b64(prefixEnd(prefix)), "sort_order": "ASCEND", "sort_target": "KEY",
	}
	if err := e.post(ctx, "/v3/kv/range", req, &resp); err != nil {
		return nil, err
	}
	out := make([]kv, 0, len(resp.Kvs))
	for _, k := range resp.Kvs {
		key, err := base64.StdEncoding.DecodeString(k.Key)
		if err != nil {
			return nil, fmt.Errorf("etcd range: bad key: %w", err)
		}
		value, err := base64.StdEncoding.DecodeString(k.Value)
		if err != nil {
			return nil, fmt.Errorf("etcd range: bad value: %w", err)
		}
		out = append(out, kv{string(key), string(value)})
	}
	return out, nil
}

func (e *etcd) put(ctx context.Context, key, value string) error {
	var resp map[string]interface{}
	return e.post(ctx, "/v3/kv/put", map[string]string{"key": b64(key), "value": b64(value)}, &resp)
}
