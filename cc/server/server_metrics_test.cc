// A real Server with --metrics_port: what /metrics shows after pushes,
// reads, a failed request and a checkpoint, and that Prometheus's promtool
// accepts the page. The gRPC health service: SERVING once started,
// NOT_SERVING while waiting for an etcd index and from the start of Shutdown.
#include "cc/server/server_metrics.h"

#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "cc/client/client.h"
#include "cc/core/table_keys.h"
#include "cc/etcd/testing/etcd_process.h"
#include "cc/metrics/http_client.h"
#include "cc/server/server.h"
#include "cc/testing/run_program.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::grpc::health::v1::Health;
using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;
using ::testing::HasSubstr;

absl::Time Deadline() { return absl::Now() + absl::Seconds(60); }

// The value of the sample `series` (name and labels exactly as written), if
// the page has it.
std::optional<double> SampleValue(const std::string& page, const std::string& series) {
  const std::string line_start = absl::StrCat("\n", series, " ");
  const size_t at = ("\n" + page).find(line_start);
  if (at == std::string::npos) return std::nullopt;
  const size_t begin = at + line_start.size() - 1;
  double value = 0;
  if (!absl::SimpleAtod(page.substr(begin, page.find('\n', begin) - begin), &value)) {
    return std::nullopt;
  }
  return value;
}

absl::StatusOr<std::string> Scrape(const Server& server) {
  return metrics::HttpGet("127.0.0.1", server.metrics_port(), "/metrics", Deadline());
}

absl::StatusOr<std::unique_ptr<Client>> ConnectTo(const Server& server) {
  ClientOptions options;
  options.servers = {server.address()};
  return Client::Connect(options);
}

ServerOptions WithMetrics() {
  ServerOptions options;
  options.metrics_http = metrics::MetricsHttpOptions{};
  return options;
}

HealthCheckResponse::ServingStatus CheckHealth(const std::string& address,
                                               const std::string& service = "") {
  auto stub = Health::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(Deadline()));
  HealthCheckRequest request;
  request.set_service(service);
  HealthCheckResponse response;
  const grpc::Status status = stub->Check(&context, request, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return response.status();
}

TEST(ServerMetricsTest, MetricsAreOffUnlessAsked) {
  ASSERT_OK_AND_ASSIGN(auto server, Server::Start(ServerOptions()));
  EXPECT_EQ(server->metrics_port(), 0);
}

TEST(ServerMetricsTest, GetStatsNamesTheMetricsAddress) {
  ASSERT_OK_AND_ASSIGN(auto server, Server::Start(WithMetrics()));
  ASSERT_OK_AND_ASSIGN(auto client, ConnectTo(*server));
  ASSERT_OK_AND_ASSIGN(std::vector<v1::ServerStats> stats, client->GetStats());
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_EQ(stats[0].metrics_address(), absl::StrCat("127.0.0.1:", server->metrics_port()));

  ASSERT_OK_AND_ASSIGN(auto plain, Server::Start(ServerOptions()));
  ASSERT_OK_AND_ASSIGN(auto plain_client, ConnectTo(*plain));
  ASSERT_OK_AND_ASSIGN(stats, plain_client->GetStats());
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_EQ(stats[0].metrics_address(), "");
}

TEST(ServerMetricsTest, AMetricsHostNoClientCouldDialIsRefusedAtStart) {
  ServerOptions options = WithMetrics();
  options.metrics_http->host = "a b";
  EXPECT_THAT(Server::Start(options),
              pserver::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                         ::testing::HasSubstr("--metrics_host 'a b'")));
}

TEST(ServerMetricsTest, CountsRequestsAndCheckpointsAsTheyHappen) {
  ServerOptions options = WithMetrics();
  options.max_param_bytes = 1 << 20;
  options.checkpoint_dir = absl::StrCat(getenv("TEST_TMPDIR"), "/metrics_checkpoints");
  ASSERT_OK_AND_ASSIGN(auto server, Server::Start(options));
  ASSERT_GT(server->metrics_port(), 0);
  ASSERT_OK_AND_ASSIGN(auto client, ConnectTo(*server));
  ASSERT_OK(client->InitParam("w", Tensor::FromValues<float>({4}, {0, 0, 0, 0})));
  ASSERT_OK(client->FinishInitParams());
  const Tensor grad = Tensor::FromValues<float>({4}, {1, 1, 1, 1});
  for (int i = 0; i < 5; ++i) ASSERT_OK(client->SendGrad("w", grad));
  for (int i = 0; i < 3; ++i) ASSERT_OK(client->GetParam("w"));
  EXPECT_THAT(client->GetParam("missing"), pserver::testing::StatusCodeIs(absl::StatusCode::kNotFound));
  ASSERT_OK(client->SaveCheckpoint());

  ASSERT_OK_AND_ASSIGN(std::string page, Scrape(*server));
  EXPECT_EQ(SampleValue(page, "pserver_requests_total{method=\"Push\"}"), 5) << page;
  EXPECT_EQ(SampleValue(page, "pserver_request_errors_total{method=\"Push\"}"), 0);
  EXPECT_EQ(SampleValue(page, "pserver_request_received_bytes_total{method=\"Push\"}"), 5 * 16);
  EXPECT_EQ(SampleValue(page, "pserver_request_duration_seconds_count{method=\"Push\"}"), 5);
  EXPECT_EQ(SampleValue(page, "pserver_request_duration_seconds_bucket{method=\"Push\",le=\"+Inf\"}"), 5);
  // Three good reads of 16 bytes, and one that failed.
  const std::optional<double> reads = SampleValue(page, "pserver_requests_total{method=\"Read\"}");
  const std::optional<double> read_errors =
      SampleValue(page, "pserver_request_errors_total{method=\"Read\"}");
  const std::optional<double> get_param_errors =
      SampleValue(page, "pserver_request_errors_total{method=\"GetParamInfo\"}");
  ASSERT_TRUE(reads && read_errors && get_param_errors) << page;
  EXPECT_GE(*reads, 3);
  EXPECT_EQ(*read_errors + *get_param_errors, 1) << page;  // wherever the client asked first
  EXPECT_EQ(SampleValue(page, "pserver_request_sent_bytes_total{method=\"Read\"}"), 3 * 16);
  EXPECT_EQ(SampleValue(page, "pserver_requests_total{method=\"FinishInitParams\"}"), 1);
  EXPECT_EQ(SampleValue(page, "pserver_requests_total{method=\"Save\"}"), 1);
  // The GetStats counters, read at scrape time.
  EXPECT_EQ(SampleValue(page, "pserver_gradients_applied_total"), 5);
  EXPECT_EQ(SampleValue(page, "pserver_initialized"), 1);
  EXPECT_EQ(SampleValue(page, "pserver_parameter_bytes"), 16);
  // The memory budgets: what is counted, and the limits (the rows' the
  // default, half the physical memory).
  const std::optional<double> state = SampleValue(page, "pserver_optimizer_state_bytes");
  ASSERT_TRUE(state.has_value()) << page;
  EXPECT_EQ(SampleValue(page, "pserver_param_budget_used_bytes"), 16 + *state);
  EXPECT_EQ(SampleValue(page, "pserver_param_budget_limit_bytes"), 1 << 20);
  const std::optional<double> row_limit =
      SampleValue(page, "pserver_table_row_budget_limit_bytes");
  ASSERT_TRUE(row_limit.has_value()) << page;
  EXPECT_GT(*row_limit, 1 << 20);
  EXPECT_EQ(SampleValue(page, "pserver_checkpoint_saves_total"), 1);
  EXPECT_EQ(SampleValue(page, "pserver_checkpoint_failures_total"), 0);
  EXPECT_EQ(SampleValue(page, "pserver_checkpoint_duration_seconds_count"), 1);
  const std::optional<double> age = SampleValue(page, "pserver_checkpoint_age_seconds");
  ASSERT_TRUE(age.has_value()) << page;
  EXPECT_GE(*age, 0);
  EXPECT_EQ(SampleValue(page, "pserver_serving"), 1);
  EXPECT_EQ(SampleValue(page, "pserver_server_info{index=\"0\",cluster=\"default\"}"), 1);
  const std::optional<double> rss = SampleValue(page, "process_resident_memory_bytes");
  const std::optional<double> threads = SampleValue(page, "process_threads");
  ASSERT_TRUE(rss && threads) << page;
  EXPECT_GT(*rss, 1 << 20);
  EXPECT_GT(*threads, 1);
  // Once, under the standard names only (not again under pserver_ names).
  EXPECT_EQ(page.find("pserver_process_"), std::string::npos) << page;
  // No etcd: no etcd, epoch or fence families.
  EXPECT_EQ(page.find("pserver_etcd_"), std::string::npos);
  EXPECT_EQ(page.find("pserver_shard_epoch"), std::string::npos);
  EXPECT_EQ(page.find("pserver_fence_"), std::string::npos);

  // More pushes show at the next scrape.
  ASSERT_OK(client->SendGrad("w", grad));
  ASSERT_OK_AND_ASSIGN(page, Scrape(*server));
  EXPECT_EQ(SampleValue(page, "pserver_requests_total{method=\"Push\"}"), 6);

  // Prometheus's own checker parses the page and lints its names.
  absl::StatusOr<std::string> promtool = FindProgram("promtool");
  if (promtool.ok()) {
    const std::string path = absl::StrCat(getenv("TEST_TMPDIR"), "/server_page.txt");
    FILE* f = fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    fwrite(page.data(), 1, page.size(), f);
    fclose(f);
    EXPECT_OK(RunProgram("/bin/sh", {"-c", absl::StrCat(*promtool, " check metrics < ", path)},
                         Deadline()));
  }
}

// Runs control method `method` on `server` and waits for its answer.
absl::Status CallControl(Server& server, const char* method,
                         const google::protobuf::Message& request,
                         google::protobuf::Message* response) {
  absl::Notification done;
  absl::Status result;
  server.dispatcher().Call(method, request, response, {}, [&](absl::Status s) {
    result = s;
    done.Notify();
  });
  done.WaitForNotification();
  return result;
}

absl::Status Clock(Server& server, const std::string& worker, v1::ClockRequest::Op op) {
  v1::ClockRequest request;
  request.set_table("emb");
  request.set_worker(worker);
  request.set_op(op);
  v1::ClockResponse response;
  return CallControl(server, "Clock", request, &response);
}

TEST(ServerMetricsTest, TablesShowRowsKeysAndEachWorkersClockLag) {
  ASSERT_OK_AND_ASSIGN(auto server, Server::Start(WithMetrics()));
  v1::CreateTableRequest create;
  create.set_name("emb");
  create.mutable_config()->set_dim(2);
  v1::CreateTableResponse created;
  ASSERT_OK(CallControl(*server, "CreateTable", create, &created));
  // w1 ticks three times, w2 once, and a worker whose id is not UTF-8 never.
  const std::string odd("w\xff", 2);
  for (const std::string& w : {std::string("w1"), std::string("w2"), odd}) {
    ASSERT_OK(Clock(*server, w, v1::ClockRequest::JOIN));
  }
  for (int i = 0; i < 3; ++i) ASSERT_OK(Clock(*server, "w1", v1::ClockRequest::TICK));
  ASSERT_OK(Clock(*server, "w2", v1::ClockRequest::TICK));

  ASSERT_OK_AND_ASSIGN(std::string page, Scrape(*server));
  EXPECT_EQ(SampleValue(page, "pserver_table_rows{table=\"emb\"}"), 0) << page;
  EXPECT_EQ(SampleValue(page, "pserver_table_row_budget_used_bytes"), 0);
  EXPECT_EQ(SampleValue(page, "pserver_table_keys_pushed_total{table=\"emb\"}"), 0);
  EXPECT_EQ(SampleValue(page, "pserver_table_workers{table=\"emb\"}"), 3);
  EXPECT_EQ(SampleValue(page, "pserver_table_min_clock{table=\"emb\"}"), 0);
  EXPECT_EQ(SampleValue(page, "pserver_table_worker_clock{table=\"emb\",worker=\"w1\"}"), 3);
  EXPECT_EQ(SampleValue(page, "pserver_table_worker_clock_lag{table=\"emb\",worker=\"w1\"}"), 0);
  EXPECT_EQ(SampleValue(page, "pserver_table_worker_clock_lag{table=\"emb\",worker=\"w2\"}"), 2);
  EXPECT_EQ(SampleValue(page, "pserver_table_worker_clock_lag{table=\"emb\",worker=\"w\xEF\xBF\xBD\"}"),
            3);
  EXPECT_EQ(SampleValue(page, "pserver_requests_total{method=\"Clock\"}"), 7);
  EXPECT_EQ(SampleValue(page, "pserver_requests_total{method=\"CreateTable\"}"), 1);
  EXPECT_EQ(SampleValue(page, "pserver_table_admissions_total{table=\"emb\"}"), 0);
  EXPECT_EQ(SampleValue(page, "pserver_table_admission_refusals_total{table=\"emb\"}"), 0);
}

TEST(ServerMetricsTest, AdmissionsAndRefusalsAreCountedPerTable) {
  ASSERT_OK_AND_ASSIGN(auto server, Server::Start(WithMetrics()));
  v1::CreateTableRequest create;
  create.set_name("adm");
  create.mutable_config()->set_dim(1);
  create.mutable_config()->mutable_eviction()->set_admission_count(2);
  v1::CreateTableResponse created;
  ASSERT_OK(CallControl(*server, "CreateTable", create, &created));
  // Keys 1 and 2 are sighted (their gradients dropped), then 1 is admitted.
  for (const std::vector<uint64_t>& keys : {std::vector<uint64_t>{1, 2}, std::vector<uint64_t>{1}}) {
    v1::TablePushRequest push;
    push.set_table("adm");
    push.set_keys(EncodeKeys(keys));
    push.set_values(std::string(keys.size() * sizeof(float), '\0'));
    v1::TablePushResponse pushed;
    ASSERT_OK(CallControl(*server, "TablePush", push, &pushed));
  }
  ASSERT_OK_AND_ASSIGN(std::string page, Scrape(*server));
  EXPECT_EQ(SampleValue(page, "pserver_table_admissions_total{table=\"adm\"}"), 1) << page;
  EXPECT_EQ(SampleValue(page, "pserver_table_admission_refusals_total{table=\"adm\"}"), 2);
  EXPECT_EQ(SampleValue(page, "pserver_table_rows{table=\"adm\"}"), 1);
  EXPECT_EQ(SampleValue(page, "pserver_table_pending_keys{table=\"adm\"}"), 1);
}

// A gradient with a NaN, sent past the client's own check (SendGrad straight
// to the dispatcher): refused for a REJECT parameter, skipped for a SKIP one.
TEST(ServerMetricsTest, NonFiniteGradientsRefusedAndSkippedAreCounted) {
  ASSERT_OK_AND_ASSIGN(auto server, Server::Start(WithMetrics()));
  ASSERT_OK_AND_ASSIGN(auto client, ConnectTo(*server));
  v1::ParameterConfig skip;
  skip.set_non_finite(v1::ParameterConfig::SKIP);
  ASSERT_OK(client->InitParam("rejects", Tensor::FromValues<float>({2}, {0, 0})));
  ASSERT_OK(client->InitParam("skips", Tensor::FromValues<float>({2}, {0, 0}), skip));
  ASSERT_OK(client->FinishInitParams());
  const float nan_values[2] = {1, std::numeric_limits<float>::quiet_NaN()};
  for (const char* name : {"rejects", "skips"}) {
    v1::SendGradRequest request;
    request.mutable_gradient()->set_name(name);
    request.mutable_gradient()->set_element_type(v1::FLOAT32);
    request.mutable_gradient()->set_content(std::string(
        reinterpret_cast<const char*>(nan_values), sizeof(nan_values)));
    v1::SendGradResponse response;
    const absl::Status status = CallControl(*server, "SendGrad", request, &response);
    if (std::string(name) == "rejects") {
      EXPECT_THAT(status, pserver::testing::StatusCodeIs(absl::StatusCode::kInvalidArgument));
    } else {
      EXPECT_OK(status);
    }
  }
  ASSERT_OK_AND_ASSIGN(std::string page, Scrape(*server));
  EXPECT_EQ(SampleValue(page, "pserver_non_finite_gradients_refused_total"), 1) << page;
  EXPECT_EQ(SampleValue(page, "pserver_non_finite_gradients_skipped_total"), 1);
  EXPECT_EQ(SampleValue(page, "pserver_requests_total{method=\"SendGrad\"}"), 2);
  EXPECT_EQ(SampleValue(page, "pserver_request_errors_total{method=\"SendGrad\"}"), 1);
  ASSERT_OK_AND_ASSIGN(Tensor skipped, client->GetParam("skips"));
  EXPECT_THAT(skipped.ToVector<float>(), ::testing::ElementsAre(0.0f, 0.0f));
}

TEST(ServerHealthTest, ServingOnceStartedAndNotServingFromShutdown) {
  ASSERT_OK_AND_ASSIGN(auto server, Server::Start(WithMetrics()));
  EXPECT_TRUE(server->Healthy());
  EXPECT_EQ(CheckHealth(server->address()), HealthCheckResponse::SERVING);
  EXPECT_EQ(CheckHealth(server->address(), "pserver.v1.ParameterServer"),
            HealthCheckResponse::SERVING);

  // A watcher sees NOT_SERVING when Shutdown begins.
  auto stub =
      Health::NewStub(grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(Deadline()));
  HealthCheckRequest request;
  auto watch = stub->Watch(&context, request);
  HealthCheckResponse response;
  ASSERT_TRUE(watch->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVING);
  std::thread stopper([&] { server->Shutdown(absl::Seconds(5)); });
  bool saw_not_serving = false;
  for (int i = 0; i < 10 && watch->Read(&response); ++i) {
    if (response.status() == HealthCheckResponse::NOT_SERVING) {
      saw_not_serving = true;
      break;
    }
  }
  context.TryCancel();
  stopper.join();
  EXPECT_TRUE(saw_not_serving);
  EXPECT_FALSE(server->Healthy());
}

TEST(ServerHealthTest, NotServingWhileWaitingForAnEtcdIndex) {
  ASSERT_OK_AND_ASSIGN(auto etcd, pserver::testing::EtcdProcess::Start());
  ServerOptions options = WithMetrics();
  options.etcd_endpoints = {etcd->endpoint()};
  options.cluster = "health";
  options.num_servers = 1;
  options.lease_ttl = absl::Seconds(2);
  ASSERT_OK_AND_ASSIGN(auto first, Server::Start(options));
  EXPECT_EQ(CheckHealth(first->address()), HealthCheckResponse::SERVING);
  ASSERT_OK_AND_ASSIGN(std::string page, Scrape(*first));
  EXPECT_EQ(SampleValue(page, "pserver_etcd_registered"), 1) << page;
  EXPECT_EQ(SampleValue(page, "pserver_etcd_registrations_total"), 1);
  const std::optional<double> first_epoch = SampleValue(page, "pserver_shard_epoch");
  ASSERT_TRUE(first_epoch.has_value()) << page;
  EXPECT_GE(*first_epoch, 1);
  EXPECT_EQ(SampleValue(page, "pserver_fence_confirmed"), 1);
  EXPECT_EQ(SampleValue(page, "pserver_fence_stepped_down"), 0);

  // The second finds the only index taken and waits; meanwhile its gRPC port
  // answers NOT_SERVING. Its port is fixed so the test can reach it.
  ServerOptions second_options = options;
  ASSERT_OK_AND_ASSIGN(auto probe, Server::Start(ServerOptions()));
  second_options.port = probe->port();
  probe->Shutdown();
  probe.reset();
  absl::StatusOr<std::unique_ptr<Server>> second;
  std::thread starter([&] { second = Server::Start(second_options); });
  const std::string second_address = absl::StrCat("127.0.0.1:", second_options.port);
  HealthCheckResponse::ServingStatus seen = HealthCheckResponse::UNKNOWN;
  for (int i = 0; i < 600 && absl::Now() < Deadline(); ++i) {
    auto stub =
        Health::NewStub(grpc::CreateChannel(second_address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
    HealthCheckResponse response;
    if (stub->Check(&context, HealthCheckRequest(), &response).ok()) {
      seen = response.status();
      break;
    }
  }
  EXPECT_EQ(seen, HealthCheckResponse::NOT_SERVING);
  first->Shutdown();  // frees the index: the second claims it
  starter.join();
  ASSERT_OK(second);
  EXPECT_EQ(CheckHealth(second_address), HealthCheckResponse::SERVING);
  // Its claim on the shard is a newer epoch.
  ASSERT_OK_AND_ASSIGN(page, Scrape(**second));
  const std::optional<double> second_epoch = SampleValue(page, "pserver_shard_epoch");
  ASSERT_TRUE(second_epoch.has_value()) << page;
  EXPECT_GT(*second_epoch, *first_epoch);
}

}  // namespace
}  // namespace pserver
