#include "cc/server/request_metrics.h"

namespace pserver {

OpMetrics* RequestMetrics::Add(const std::string& method) {
  std::unique_ptr<OpMetrics>& op = ops_[method];
  if (op == nullptr) op = std::make_unique<OpMetrics>();
  return op.get();
}

const OpMetrics* RequestMetrics::Find(const std::string& method) const {
  auto it = ops_.find(method);
  return it == ops_.end() ? nullptr : it->second.get();
}

void RequestMetrics::Collect(metrics::TextWriter& out) const {
  using metrics::Type;
  const struct {
    const char* name;
    const char* help;
    metrics::Counter OpMetrics::*counter;
  } counters[] = {
      {"pserver_requests_total", "Requests answered, by method.", &OpMetrics::calls},
      {"pserver_request_errors_total", "Requests answered with an error, by method.",
       &OpMetrics::errors},
      {"pserver_request_received_bytes_total",
       "Request payload bytes received (tensor contents for Push, messages otherwise).",
       &OpMetrics::received_bytes},
      {"pserver_request_sent_bytes_total",
       "Reply payload bytes sent (tensor contents for Read, messages otherwise).",
       &OpMetrics::sent_bytes},
  };
  for (const auto& family : counters) {
    out.Family(family.name, family.help, Type::kCounter);
    for (const auto& [method, op] : ops_) {
      out.Sample(family.name, {{"method", method}}, (op.get()->*family.counter).value());
    }
  }
  out.Family("pserver_request_duration_seconds",
             "Time from receiving a request to answering it, by method.", Type::kHistogram);
  for (const auto& [method, op] : ops_) {
    const metrics::Histogram::Snapshot s = op->latency.Read();
    out.Histogram("pserver_request_duration_seconds", {{"method", method}}, op->latency.bounds(),
                  s.buckets, s.sum, 1e9);
  }
}

}  // namespace pserver
