// Traces of a worker and its servers on one host (cc/trace,
// cc/client/client_trace.h, ServerOptions::trace_file): the files parse, hold
// the events of a known sequence of calls, nest (a server's span inside the
// client's request span for the same push id: one clock, CLOCK_MONOTONIC),
// keep to their cap and are written at shutdown. Ordering only, no timing.
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "cc/client/client.h"
#include "cc/client/client_trace.h"
#include "cc/client/table.h"
#include "cc/core/tensor.h"
#include "cc/server/server.h"
#include "cc/testing/status_matchers.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  return absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
}

// One "X" event of a trace file.
struct Span {
  std::string name;
  std::string category;
  double start = 0;
  double end = 0;
  double tid = 0;
  std::map<std::string, std::string> args;  // numbers as written by %g

  bool Within(const Span& outer) const { return outer.start <= start && end <= outer.end; }
  std::string Describe() const {
    std::string out = absl::StrCat(name, " [", start, ", ", end, "] tid ", tid);
    for (const auto& [k, v] : args) absl::StrAppend(&out, " ", k, "=", v);
    return out;
  }
};

struct TraceFile {
  std::vector<Span> spans;
  double dropped = -1;
  std::string process_name;
};

// Parses `path` as JSON (google.protobuf.Struct takes any object).
TraceFile Load(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  google::protobuf::Struct parsed;
  const auto status = google::protobuf::util::JsonStringToMessage(text.str(), &parsed);
  EXPECT_TRUE(status.ok()) << path << ": " << status.ToString();
  TraceFile file;
  if (!status.ok()) return file;
  const auto& other = parsed.fields().at("otherData").struct_value().fields();
  file.dropped = other.at("dropped_events").number_value();
  file.process_name = other.at("process_name").string_value();
  for (const auto& value : parsed.fields().at("traceEvents").list_value().values()) {
    const auto& e = value.struct_value().fields();
    if (e.at("ph").string_value() != "X") continue;
    Span span;
    span.name = e.at("name").string_value();
    span.category = e.at("cat").string_value();
    span.start = e.at("ts").number_value();
    span.end = span.start + e.at("dur").number_value();
    span.tid = e.at("tid").number_value();
    if (auto it = e.find("args"); it != e.end()) {
      for (const auto& [k, v] : it->second.struct_value().fields()) {
        span.args[k] = v.kind_case() == google::protobuf::Value::kStringValue
                           ? v.string_value()
                           : absl::StrCat(v.number_value());
      }
    }
    file.spans.push_back(std::move(span));
  }
  return file;
}

// The spans named `name` (of `category`, if given).
std::vector<Span> Named(const TraceFile& file, const std::string& name,
                        const std::string& category = "") {
  std::vector<Span> out;
  for (const Span& s : file.spans) {
    if (s.name == name && (category.empty() || s.category == category)) out.push_back(s);
  }
  return out;
}

// Spans of one track either nest or are apart (a viewer draws nothing
// else right); with `disjoint`, they never overlap at all.
void ExpectTracksNest(const TraceFile& file, bool disjoint) {
  for (size_t a = 0; a < file.spans.size(); ++a) {
    for (size_t b = a + 1; b < file.spans.size(); ++b) {
      const Span& x = file.spans[a];
      const Span& y = file.spans[b];
      if (x.tid != y.tid) continue;
      const bool apart = x.end <= y.start || y.end <= x.start;
      const bool nested = x.Within(y) || y.Within(x);
      EXPECT_TRUE(apart || (!disjoint && nested)) << x.Describe() << " / " << y.Describe();
    }
  }
}

absl::StatusOr<std::unique_ptr<Server>> StartServer(uint32_t index, const std::string& trace,
                                                    size_t max_events = size_t{1} << 18) {
  ServerOptions options;
  options.index = index;
  options.trace_file = trace;
  options.trace_max_events = max_events;
  return Server::Start(options);
}

TEST(TraceTest, WorkerAndServersTraceAKnownSequenceOfCalls) {
  const std::string server_files[] = {TempPath("server0.json"), TempPath("server1.json")};
  const std::string client_file = TempPath("worker.json");
  std::vector<std::unique_ptr<Server>> servers;
  ClientOptions options;
  for (uint32_t i = 0; i < 2; ++i) {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Server> server, StartServer(i, server_files[i]));
    options.servers.push_back(server->address());
    servers.push_back(std::move(server));
  }
  options.trace_file = client_file;
  options.block_bytes = 64;  // "big" (128 floats) is cut into 8 blocks over both servers,
  options.max_request_bytes = 64;  // each sent alone: 4 requests to a server at once
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(options));
  const uint64_t client_id = client->client_id();

  std::vector<float> zeros(128, 0.0f), ones(128, 1.0f);
  ASSERT_OK(client->InitParam("w", Tensor::FromValues<float>({2}, {0, 0})));
  ASSERT_OK(client->InitParam("big", Tensor::FromValues<float>({128}, zeros)));
  ASSERT_OK(client->FinishInitParams());
  std::vector<NamedTensor> grads;
  grads.push_back({"w", Tensor::FromValues<float>({2}, {1, 1})});
  grads.push_back({"big", Tensor::FromValues<float>({128}, ones)});
  ASSERT_OK(client->SendGrads(grads));
  ASSERT_OK(client->GetParams({"w", "big"}));
  std::vector<Tensor> outs(2);
  ASSERT_OK(client->PushPull(grads, absl::MakeSpan(outs)));
  ASSERT_OK(client->SendGradsAsync(grads).Wait(absl::Seconds(60)));
  v1::TableConfig config;
  config.set_dim(2);
  config.mutable_optimizer()->mutable_sgd()->set_learning_rate(1.0);
  ASSERT_OK_AND_ASSIGN(Table table, Table::Create(*client, "emb", config));
  const std::vector<uint64_t> keys = {1, 2, 3, 4, 5};
  ASSERT_OK(table.Push<float>(keys, std::vector<float>(10, 1.0f)));
  std::vector<float> rows(10);
  ASSERT_OK(table.Pull<float>(keys, absl::MakeSpan(rows)));

  client.reset();  // writes the worker's file
  for (auto& server : servers) server->Shutdown();  // and each server's

  const TraceFile worker = Load(client_file);
  EXPECT_EQ(worker.dropped, 0);
  EXPECT_EQ(worker.process_name, "pserver client");
  std::map<std::string, Span> calls;  // by call id
  std::multiset<std::string> call_names;
  for (const Span& s : worker.spans) {
    if (s.category != "call") continue;
    calls[s.args.at("call")] = s;
    call_names.insert(s.name);
  }
  for (const char* name : {"InitParams", "SendGrads", "GetParams", "PushPull", "TablePush",
                           "TablePull"}) {
    EXPECT_GE(call_names.count(name), 1u) << name;
  }
  EXPECT_EQ(call_names.count("SendGrads"), 2u);  // blocking and async
  // The async call waited in the queue first.
  const std::vector<Span> queued = Named(worker, "queued");
  ASSERT_EQ(queued.size(), 1u);
  const Span& async_call = calls.at(queued[0].args.at("call"));
  EXPECT_EQ(async_call.name, "SendGrads");
  EXPECT_LE(queued[0].start, queued[0].end);
  EXPECT_LE(queued[0].end, async_call.start) << queued[0].Describe() << " / " << async_call.Describe();
  // No two spans of one worker track overlap (requests in flight at once
  // take lanes of their server's tracks).
  ExpectTracksNest(worker, /*disjoint=*/true);

  // Every request lies within its call; pushes are found by their request id.
  std::map<std::pair<std::string, std::string>, Span> pushes;  // (server, sequence) -> request
  int requests = 0;
  for (const Span& s : worker.spans) {
    if (s.category != "request") continue;
    ++requests;
    ASSERT_TRUE(s.args.count("call")) << s.Describe();
    const Span& call = calls.at(s.args.at("call"));
    EXPECT_EQ(s.name, call.name);
    EXPECT_TRUE(s.Within(call)) << s.Describe() << " / " << call.Describe();
    const double lanes = ClientTrace::kServerTrackBase +
                         ClientTrace::kLanes * std::stod(s.args.at("server"));
    EXPECT_GE(s.tid, lanes);
    EXPECT_LT(s.tid, lanes + ClientTrace::kLanes);
    EXPECT_EQ(s.args.at("status"), "OK");
    if (s.args.count("sequence")) {
      EXPECT_EQ(s.args.at("client_id"), absl::StrCat(absl::Hex(client_id)));
      pushes[{s.args.at("server"), s.args.at("sequence")}] = s;
    }
  }
  EXPECT_GE(requests, 20);
  // Some server got several requests at once, on lanes of its own.
  std::set<double> tracks;
  for (const Span& s : worker.spans) {
    if (s.category == "request") tracks.insert(s.tid);
  }
  EXPECT_GT(tracks.size(), 2u);

  for (int i = 0; i < 2; ++i) {
    SCOPED_TRACE(absl::StrCat("server ", i));
    const TraceFile server = Load(server_files[i]);
    EXPECT_EQ(server.dropped, 0);
    EXPECT_EQ(server.process_name, absl::StrCat("pserver server ", i));
    // Each applied push (bulk: "apply push"; table: "TablePush") is inside
    // the worker's request that carried its id.
    int matched = 0;
    for (const Span& s : server.spans) {
      if (s.name != "apply push" && s.name != "TablePush") continue;
      if (s.args.at("client_id") != absl::StrCat(absl::Hex(client_id))) continue;
      auto it = pushes.find({absl::StrCat(i), s.args.at("sequence")});
      ASSERT_NE(it, pushes.end()) << s.Describe();
      EXPECT_TRUE(s.Within(it->second)) << s.Describe() << " / " << it->second.Describe();
      ++matched;
    }
    // SendGrads twice and PushPull once reach both servers (blocks of "big"),
    // and the table's keys are spread over both.
    EXPECT_GE(matched, 4);
    // A bulk frame holds its stages, on the thread that served it.
    const std::vector<Span> frames = Named(server, "bulk frame");
    ASSERT_FALSE(frames.empty());
    for (const Span& receive : Named(server, "receive")) {
      bool inside = false;
      for (const Span& frame : frames) inside |= frame.tid == receive.tid && receive.Within(frame);
      EXPECT_TRUE(inside) << receive.Describe();
    }
    EXPECT_FALSE(Named(server, "read").empty());
    EXPECT_FALSE(Named(server, "write reply").empty());
    EXPECT_FALSE(Named(server, "InitParam").empty());
    ExpectTracksNest(server, /*disjoint=*/false);
  }
}

TEST(TraceTest, ACallThatWaitedGoesToTheWaitingLanes) {
  const std::string path = TempPath("barrier.json");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Server> server, StartServer(0, path));
  v1::BarrierRequest first, second;
  first.set_name("b");
  first.set_generation(1);
  first.set_size(2);
  first.set_participant("a");
  second = first;
  second.set_participant("b");
  v1::BarrierResponse first_response, second_response;
  absl::Notification first_done, second_done;
  server->dispatcher().Call("Barrier", first, &first_response, {},
                            [&](absl::Status s) { EXPECT_OK(s); first_done.Notify(); });
  EXPECT_FALSE(first_done.HasBeenNotified());  // it waits for the second
  server->dispatcher().Call("Barrier", second, &second_response, {},
                            [&](absl::Status s) { EXPECT_OK(s); second_done.Notify(); });
  ASSERT_TRUE(first_done.WaitForNotificationWithTimeout(absl::Seconds(60)));
  ASSERT_TRUE(second_done.WaitForNotificationWithTimeout(absl::Seconds(60)));
  server->Shutdown();
  const std::vector<Span> barriers = Named(Load(path), "Barrier");
  ASSERT_EQ(barriers.size(), 2u);
  int waited = 0;
  for (const Span& b : barriers) {
    if (b.args.count("waited")) {
      ++waited;
      EXPECT_EQ(b.tid, 1u << 30) << b.Describe();  // the first "waiting calls" lane
    } else {
      EXPECT_LT(b.tid, 1u << 30) << b.Describe();  // its thread's track
    }
  }
  EXPECT_EQ(waited, 1);
}

TEST(TraceTest, ServerKeepsTheNewestEventsUpToItsCap) {
  const std::string path = TempPath("capped.json");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Server> server, StartServer(0, path, /*max_events=*/5));
  ClientOptions options;
  options.servers = {server->address()};
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(options));
  ASSERT_OK(client->InitParam("w", Tensor::FromValues<float>({2}, {0, 0})));
  ASSERT_OK(client->FinishInitParams());
  const Tensor grad = Tensor::FromValues<float>({2}, {1, 1});
  for (int i = 0; i < 20; ++i) ASSERT_OK(client->SendGrad("w", grad));
  client.reset();
  server.reset();  // the destructor shuts down, which writes the file
  const TraceFile file = Load(path);
  EXPECT_EQ(file.spans.size(), 5u);
  EXPECT_GT(file.dropped, 20);  // at least a push's stages each
}

TEST(TraceTest, UnwritableTraceFilesAreRefusedAtStart) {
  const std::string bad = "/nonexistent-trace-dir/t.json";
  EXPECT_THAT(StartServer(0, bad).status(),
              pserver::testing::StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(bad)));
  EXPECT_THAT(StartServer(0, TempPath("zero.json"), 0).status(),
              pserver::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                         HasSubstr("max_events")));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Server> server, StartServer(0, ""));
  ClientOptions options;
  options.servers = {server->address()};
  options.trace_file = bad;
  EXPECT_THAT(Client::Connect(options).status(),
              pserver::testing::StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(bad)));
}

TEST(TraceTest, EnvironmentTracesAClientWithoutOptions) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Server> server, StartServer(0, ""));
  const std::string path = TempPath("from_env.json");
  setenv("PSERVER_TRACE", path.c_str(), 1);
  ClientOptions options;
  options.servers = {server->address()};
  auto connected = Client::Connect(options);
  unsetenv("PSERVER_TRACE");
  ASSERT_OK(connected.status());
  std::unique_ptr<Client> client = std::move(*connected);
  ASSERT_OK(client->InitParam("w", Tensor::FromValues<float>({2}, {0, 0})));
  ASSERT_OK(client->FlushTrace());
  EXPECT_EQ(Named(Load(path), "InitParams", "call").size(), 1u);
  ASSERT_OK(client->FinishInitParams());
  ASSERT_OK(client->SendGrad("w", Tensor::FromValues<float>({2}, {1, 1})));
  client.reset();
  EXPECT_EQ(Named(Load(path), "SendGrads", "call").size(), 1u);
}

}  // namespace
}  // namespace pserver
