// The client's routing snapshot and how it follows PlacementMoved (live
// moves, docs/elastic.md): three in-process servers, each with a placement
// gate; the test moves blocks from 2 servers to 3 itself (each moving block
// copied to its new owner, then the old owner's gate refuses it) and checks
// that pushes, reads and push-pulls are re-routed without an error and
// applied exactly once. Table calls are checked both as control calls and
// as table frames (Transport::TableRows, served by the dispatcher's
// PullTableRows/PushTableRows). No timing: waits are bounded loops on
// conditions.
#include <atomic>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cc/client/client.h"
#include "cc/client/table.h"
#include "cc/client/testing/placement_moves.h"
#include "cc/core/parameter_store.h"
#include "cc/core/placement.h"
#include "cc/core/table_keys.h"
#include "cc/core/tables.h"
#include "cc/rpc/frame.h"
#include "cc/rpc/table_frame.h"
#include "cc/server/dispatcher.h"
#include "cc/server/in_process_transport.h"
#include "cc/server/placement_gate.h"
#include "cc/server/table_bulk.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::NameMoving;
using ::pserver::testing::PlacementSpec;
using ::pserver::testing::StatusIs;
using ::testing::HasSubstr;

constexpr size_t kBlockBytes = 8;  // two floats a block

// One in-process server: its store, dispatcher and placement gate.
struct TestServer {
  explicit TestServer(int index) : index(index) { dispatcher.SetPlacementGate(&gate); }
  const int index;
  ParameterStore store;
  Tables tables{TablesOptions()};
  Dispatcher dispatcher{&store, &tables, static_cast<uint32_t>(index)};
  PlacementGate gate{index, Placement::Jump(2, 1)};
};

// An in-process transport that also carries table frames: each goes
// straight to the dispatcher's PullTableRows / PushTableRows, as the bulk
// listener hands them on; `frames` counts those sent.
class TableFrameTransport final : public Transport {
 public:
  TableFrameTransport(Dispatcher* dispatcher, std::atomic<int>* frames)
      : dispatcher_(dispatcher), calls_(dispatcher), frames_(frames) {}

  const std::string& address() const override { return calls_.address(); }
  void Call(absl::string_view method, const google::protobuf::Message& request,
            google::protobuf::Message* response, absl::Time deadline, Done done) override {
    calls_.Call(method, request, response, deadline, std::move(done));
  }
  void Push(const RequestId& id, absl::Span<const GradientView> grads, absl::Time deadline,
            Done done, TraceRecorder* trace) override {
    calls_.Push(id, grads, deadline, std::move(done), trace);
  }
  void Pull(absl::Span<const v1::ParamRef> refs, BlockSink sink, absl::Time deadline, Done done,
            TraceRecorder* trace) override {
    calls_.Pull(refs, std::move(sink), deadline, std::move(done), trace);
  }
  void PushPull(const RequestId& id, absl::Span<const GradientView> grads,
                absl::Span<const v1::ParamRef> refs, BlockSink sink, absl::Time deadline, Done done,
                TraceRecorder* trace) override {
    calls_.PushPull(id, grads, refs, std::move(sink), deadline, std::move(done), trace);
  }
  bool TableRows(FrameMethod method, const TableFrame& frame, RowsSink rows, absl::Time,
                 Done& done, TraceRecorder*) override {
    frames_->fetch_add(1);
    const TableRowsView view = TableRowsViewOf(frame);
    absl::Status status;
    if (method == FrameMethod::kTableRowsPush) {
      status = dispatcher_->PushTableRows(view, frame.client_id, frame.sequence);
    } else {
      std::string reply;
      ElementType type = v1::ELEMENT_TYPE_UNSPECIFIED;
      status = dispatcher_->PullTableRows(
          view, [&](size_t bytes, ElementType content_type) -> absl::StatusOr<absl::Span<char>> {
            reply.resize(bytes);
            type = content_type;
            return absl::MakeSpan(reply);
          });
      if (status.ok()) status = rows(static_cast<uint32_t>(type), reply);
    }
    Done taken = std::move(done);
    taken(std::move(status));
    return true;
  }

 private:
  Dispatcher* const dispatcher_;
  InProcessTransport calls_;
  std::atomic<int>* const frames_;
};

class PlacementRoutingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 3; ++i) servers_.push_back(std::make_unique<TestServer>(i));
    sgd_.mutable_optimizer()->mutable_sgd();
    sgd_.mutable_learning_rate()->set_learning_rate(1.0);
  }

  // A transport to server `index`: one that carries table frames once
  // `table_frames_` is set.
  std::unique_ptr<Transport> TransportTo(int index) {
    Dispatcher* dispatcher = &servers_[index]->dispatcher;
    if (table_frames_) return std::make_unique<TableFrameTransport>(dispatcher, &frames_);
    return std::make_unique<InProcessTransport>(dispatcher);
  }

  // A client of servers 0 and 1 (server 2 joins later).
  std::unique_ptr<Client> NewClient(absl::Duration timeout = absl::Seconds(60)) {
    ClientOptions options;
    options.block_bytes = kBlockBytes;
    options.timeout = timeout;
    std::vector<std::unique_ptr<Transport>> transports;
    for (int i = 0; i < 2; ++i) transports.push_back(TransportTo(i));
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options, std::move(transports));
    EXPECT_OK(client.status());
    return client.ok() ? *std::move(client) : nullptr;
  }

  void Join(Client& client) {
    ASSERT_OK(client.SetTransport(2, TransportTo(2)));
  }

  // Moves every block of `names` whose owner changes from 2 to 3 servers to
  // its new owner (value and all: SGD keeps no state), then every gate
  // follows placement `version` for 3 servers: the old owners refuse them.
  void MoveToThree(const std::vector<std::string>& names, uint64_t version) {
    const Placement two = Placement::Jump(2, 1, kBlockBytes);
    const Placement three = Placement::Jump(3, 1, kBlockBytes);
    for (const std::string& name : names) {
      v1::ParamRef ref;
      ref.set_name(name);
      v1::Parameter header;
      ASSERT_OK(servers_[two.HomeServer(name)]->store.Get(ref, &header));
      const uint32_t count = std::max<uint32_t>(1, header.block().count());
      for (uint32_t b = 0; b < count; ++b) {
        const int from = two.ServerOf(name, b);
        const int to = three.ServerOf(name, b);
        if (from == to) continue;
        ref.mutable_block()->set_index(b);
        ref.mutable_block()->set_count(count);
        v1::Parameter block;
        ASSERT_OK(servers_[from]->store.Get(ref, &block));
        ASSERT_OK(servers_[to]->store.Init(block, sgd_));
      }
    }
    servers_[2]->store.FinishInit();
    for (auto& server : servers_) server->gate.Set(Placement::Jump(3, version));
  }

  // A client (following placement version 1 when `follows`) that
  // initialized NameMoving(0, 2) to {0, 0}, which then moved to server 2
  // under version 2; the moving name in *moving.
  std::unique_ptr<Client> ClientAfterAMove(bool follows, std::string* moving) {
    std::unique_ptr<Client> client = NewClient();
    if (client == nullptr) return nullptr;
    if (follows) EXPECT_OK(client->UpdatePlacement(PlacementSpec(1, 2)));
    *moving = NameMoving(0, 2);
    EXPECT_OK(client->InitParam(*moving, Tensor::FromValues<float>({2}, {0, 0}), sgd_));
    EXPECT_OK(client->FinishInitParams());
    MoveToThree({*moving}, /*version=*/2);
    return client;
  }

  // The values of `name` as the servers holding it under `placement` store them.
  std::vector<float> Stored(const std::string& name, const Placement& placement, uint32_t count,
                            size_t elements) {
    std::vector<float> out(elements);
    for (uint32_t b = 0; b < count; ++b) {
      v1::ParamRef ref;
      ref.set_name(name);
      ref.mutable_block()->set_index(b);
      ref.mutable_block()->set_count(count);
      v1::Parameter block;
      EXPECT_OK(servers_[placement.ServerOf(name, b)]->store.Get(ref, &block));
      std::memcpy(out.data() + block.block().offset(), block.content().data(),
                  block.content().size());
    }
    return out;
  }

  // Table pulls and pushes follow PlacementMoved as bulk calls do: only
  // the keys of the refused requests go again, to their owners under the
  // placement named, and each push is applied once (the body of the table
  // tests below).
  void TableCallsFollowPlacementMoved();

  std::vector<std::unique_ptr<TestServer>> servers_;
  v1::ParameterConfig sgd_;
  bool table_frames_ = false;
  std::atomic<int> frames_{0};
};

TEST_F(PlacementRoutingTest, RoutesByTheFromCountWhileMovingAndGrowsForNewServers) {
  std::unique_ptr<Client> client = NewClient();
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->num_servers(), 2);
  EXPECT_EQ(client->placement().version(), 0u);

  ASSERT_OK(client->UpdatePlacement(PlacementSpec(5, 3, /*from=*/2)));
  Client::Routing routing = client->routing();
  EXPECT_TRUE(routing.moving);
  EXPECT_EQ(routing.route.num_servers(), 2);
  EXPECT_EQ(routing.route.version(), 5u);
  EXPECT_EQ(routing.target.num_servers(), 3);
  EXPECT_EQ(client->placement().num_servers(), 2);  // routing goes by FROM
  EXPECT_EQ(client->num_servers(), 3);              // every server holding state
  EXPECT_EQ(client->etcd_placement_version(), 5u);
  // Server 2 is named before it registered: a placeholder stands in.
  ASSERT_EQ(client->addresses().size(), 3u);
  EXPECT_EQ(client->addresses()[2], "/ps/2 (not registered)");
  CallOptions soon;
  soon.deadline = absl::Now() + absl::Seconds(2);
  EXPECT_THAT(client->CheckHealth(soon),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("server 2 is not registered in etcd (/ps/2) yet")));

  // Older or equal versions are ignored; malformed ones refused, nothing changed.
  ASSERT_OK(client->UpdatePlacement(PlacementSpec(4, 1)));
  ASSERT_OK(client->UpdatePlacement(PlacementSpec(5, 1)));
  EXPECT_EQ(client->routing().target.num_servers(), 3);
  EXPECT_THAT(client->UpdatePlacement(PlacementSpec(6, 3, /*from=*/kMaxPlacementServers + 1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("moving from 4097 servers")));
  EXPECT_THAT(client->UpdatePlacement(PlacementSpec(6, kMaxPlacementServers + 1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("4097")));
  EXPECT_EQ(client->etcd_placement_version(), 5u);
  EXPECT_THAT(client->SetTransport(kMaxPlacementServers,
                                   std::make_unique<InProcessTransport>(&servers_[2]->dispatcher)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("outside [0, 4096)")));

  // Done moving: 3 servers for everything.
  Join(*client);
  ASSERT_OK(client->UpdatePlacement(PlacementSpec(6, 3)));
  routing = client->routing();
  EXPECT_FALSE(routing.moving);
  EXPECT_EQ(client->placement().num_servers(), 3);
  EXPECT_EQ(client->num_servers(), 3);
  servers_[2]->store.FinishInit();
  ASSERT_OK_AND_ASSIGN(std::vector<Client::HealthStatus> health, client->CheckHealth());
  EXPECT_EQ(health.size(), 3u);

  // A batch may name servers beyond the count given (a newer placement's).
  std::vector<Client::Batch> batches =
      Client::PackBatches({0, 3, 3}, {1, 1, 1}, /*max_bytes=*/10, /*num_servers=*/2);
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_EQ(batches[1].server, 3);
  EXPECT_EQ(batches[1].items, (std::vector<size_t>{1, 2}));
}

TEST_F(PlacementRoutingTest, RefusedBlocksAreSentToTheirNewOwnersExactlyOnce) {
  std::unique_ptr<Client> client = NewClient();
  ASSERT_NE(client, nullptr);
  ASSERT_OK(client->UpdatePlacement(PlacementSpec(1, 2)));  // as etcd would at connect
  const std::string moving = NameMoving(0, 2);
  const std::string staying0 = NameMoving(0, 0);
  const std::string staying1 = NameMoving(1, 1);
  const std::string wide = "wide";  // 4 blocks over the servers
  const std::vector<std::string> names = {moving, staying0, staying1, wide};
  for (const std::string& name : names) {
    const size_t n = name == wide ? 8 : 2;
    ASSERT_OK(client->InitParam(name, Tensor::FromValues<float>({static_cast<int64_t>(n)},
                                                                std::vector<float>(n, 0)),
                                sgd_));
  }
  ASSERT_OK(client->FinishInitParams());
  std::vector<NamedTensor> step;
  for (const std::string& name : names) {
    const size_t n = name == wide ? 8 : 2;
    step.push_back({name, Tensor::FromValues<float>({static_cast<int64_t>(n)},
                                                    std::vector<float>(n, -1))});
  }
  ASSERT_OK(client->SendGrads(step));
  Join(*client);
  MoveToThree(names, /*version=*/2);

  // The client has not seen version 2: the batch waits for it (the request
  // to server 1 was applied; only the refused one is sent again).
  std::future<absl::Status> pushed =
      std::async(std::launch::async, [&] { return client->SendGrads(step); });
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  for (int i = 0; i < 60000 && client->placement_waits() == 0 && absl::Now() < deadline; ++i) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(client->placement_waits(), 1u);
  ASSERT_OK(client->UpdatePlacement(PlacementSpec(2, 3, /*from=*/2)));
  ASSERT_OK(pushed.get());
  EXPECT_GT(client->redirects(), 0u);

  // Seen now: routed by the FROM count, refused, re-routed, no more waiting.
  const uint64_t redirects = client->redirects();
  ASSERT_OK(client->SendGrad(moving, step[0].tensor));
  EXPECT_GT(client->redirects(), redirects);
  std::vector<Tensor> outs(names.size());
  ASSERT_OK(client->PushPull(step, absl::MakeSpan(outs)));
  EXPECT_EQ(outs[0].ToVector<float>(), (std::vector<float>{4, 4}));
  EXPECT_EQ(outs[1].ToVector<float>(), (std::vector<float>{3, 3}));
  EXPECT_EQ(outs[3].ToVector<float>(), std::vector<float>(8, 3));
  EXPECT_EQ(client->placement_waits(), 1u);

  // Done moving: straight to the owners, nothing refused.
  ASSERT_OK(client->UpdatePlacement(PlacementSpec(3, 3)));
  const uint64_t before = client->redirects();
  ASSERT_OK(client->SendGrads(step));
  EXPECT_EQ(client->redirects(), before);
  ASSERT_OK_AND_ASSIGN(std::vector<Tensor> read, client->GetParams(names));
  EXPECT_EQ(read[0].ToVector<float>(), (std::vector<float>{5, 5}));
  EXPECT_EQ(read[1].ToVector<float>(), (std::vector<float>{4, 4}));
  EXPECT_EQ(read[2].ToVector<float>(), (std::vector<float>{4, 4}));
  EXPECT_EQ(read[3].ToVector<float>(), std::vector<float>(8, 4));

  // Every push was applied exactly once, by the owner of the moment: the
  // new owners hold everything, the old owner of the moved block what it
  // had when it handed it over.
  const Placement three = Placement::Jump(3, 3, kBlockBytes);
  EXPECT_EQ(Stored(moving, three, 1, 2), (std::vector<float>{5, 5}));
  EXPECT_EQ(Stored(wide, three, 4, 8), std::vector<float>(8, 4));
  EXPECT_EQ(Stored(moving, Placement::Jump(2, 1, kBlockBytes), 1, 2), (std::vector<float>{1, 1}));
}

TEST_F(PlacementRoutingTest, ReadsFollowAndLearnTheLayoutFromTheNewOwner) {
  std::unique_ptr<Client> writer = NewClient();
  ASSERT_NE(writer, nullptr);
  const std::string moving = NameMoving(0, 2);
  ASSERT_OK(writer->InitParam(moving, Tensor::FromValues<float>({2}, {7, 8}), sgd_));
  ASSERT_OK(writer->FinishInitParams());
  MoveToThree({moving}, /*version=*/2);

  // A reader that knows nothing of the parameter, moving already.
  std::unique_ptr<Client> reader = NewClient();
  ASSERT_NE(reader, nullptr);
  ASSERT_OK(reader->UpdatePlacement(PlacementSpec(2, 3, /*from=*/2)));
  Join(*reader);
  ASSERT_OK_AND_ASSIGN(Tensor w, reader->GetParam(moving));
  EXPECT_EQ(w.ToVector<float>(), (std::vector<float>{7, 8}));
  EXPECT_EQ(reader->redirects(), 1u);
  EXPECT_EQ(reader->placement_waits(), 0u);
}

TEST_F(PlacementRoutingTest, AClientThatFollowsNoPlacementReportsTheRefusal) {
  std::string moving;
  std::unique_ptr<Client> client = ClientAfterAMove(/*follows=*/false, &moving);
  ASSERT_NE(client, nullptr);
  const absl::Status refused = client->SendGrad(moving, Tensor::FromValues<float>({2}, {-1, -1}));
  EXPECT_EQ(PlacementMovedVersion(refused), std::optional<uint64_t>(2)) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("this client follows no /placement"));
  EXPECT_EQ(client->placement_waits(), 0u);
}

TEST_F(PlacementRoutingTest, TheWaitForANewerPlacementEndsAtTheDeadline) {
  std::string moving;
  std::unique_ptr<Client> client = ClientAfterAMove(/*follows=*/true, &moving);
  ASSERT_NE(client, nullptr);
  CallOptions call;
  call.deadline = absl::Now() + absl::Seconds(2);
  EXPECT_THAT(client->SendGrad(moving, Tensor::FromValues<float>({2}, {-1, -1}), call),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       AllOf(HasSubstr("placement moved: version 2"),
                             HasSubstr("waited until the call's deadline for /placement "
                                       "version 2, this client has seen version 1"))));
  EXPECT_EQ(client->placement_waits(), 1u);
  // Nothing was applied anywhere.
  EXPECT_EQ(Stored(moving, Placement::Jump(3, 2, kBlockBytes), 1, 2), (std::vector<float>{0, 0}));
}

TEST_F(PlacementRoutingTest, CancellingEndsTheWaitForANewerPlacement) {
  std::string moving;
  std::unique_ptr<Client> client = ClientAfterAMove(/*follows=*/true, &moving);
  ASSERT_NE(client, nullptr);
  Cancellation cancel;
  CallOptions call;
  call.cancel = &cancel;
  std::future<absl::Status> pushed = std::async(std::launch::async, [&] {
    return client->SendGrad(moving, Tensor::FromValues<float>({2}, {-1, -1}), call);
  });
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  for (int i = 0; i < 60000 && client->placement_waits() == 0 && absl::Now() < deadline; ++i) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(client->placement_waits(), 1u);
  cancel.Cancel();
  EXPECT_THAT(pushed.get(), StatusIs(absl::StatusCode::kCancelled, ::testing::_));
  EXPECT_EQ(Stored(moving, Placement::Jump(3, 2, kBlockBytes), 1, 2), (std::vector<float>{0, 0}));
}

TEST_F(PlacementRoutingTest, ARefusalUnderThePlacementRoutedByIsReportedNotLooped) {
  std::string moving;
  std::unique_ptr<Client> client = ClientAfterAMove(/*follows=*/false, &moving);
  ASSERT_NE(client, nullptr);
  Join(*client);
  ASSERT_OK(client->UpdatePlacement(PlacementSpec(2, 3)));
  // Server 2 disagrees: it thinks version 2 is for 2 servers.
  servers_[2]->gate.Set(Placement::Jump(2, 2));
  const absl::Status refused = client->SendGrad(moving, Tensor::FromValues<float>({2}, {-1, -1}));
  EXPECT_EQ(PlacementMovedVersion(refused), std::optional<uint64_t>(2)) << refused;
  EXPECT_THAT(refused.message(),
              HasSubstr("not followed: this client routes by version 2 and sent these blocks 2 "
                        "times"));
}

// A server whose placement is always one version ahead: it refuses every
// push with PlacementMoved naming the version after the client's, which it
// first tells the client (as etcd would), so each redirect is followable.
class AlwaysMovedTransport final : public Transport {
 public:
  const std::string& address() const override { return address_; }
  void Call(absl::string_view, const google::protobuf::Message&, google::protobuf::Message*,
            absl::Time, Done done) override {
    done(absl::UnimplementedError("no control calls"));
  }
  void Push(const RequestId&, absl::Span<const GradientView>, absl::Time, Done done,
            TraceRecorder*) override {
    const uint64_t next = client->etcd_placement_version() + 1;
    ASSERT_OK(client->UpdatePlacement(PlacementSpec(next, 1)));
    ++pushes;
    done(PlacementMoved(next, "parameter 'w' block 0 of 1", 0, 0));
  }
  void Pull(absl::Span<const v1::ParamRef>, BlockSink, absl::Time, Done done,
            TraceRecorder*) override {
    done(absl::UnimplementedError("no pulls"));
  }
  void PushPull(const RequestId&, absl::Span<const GradientView>, absl::Span<const v1::ParamRef>,
                BlockSink, absl::Time, Done done, TraceRecorder*) override {
    done(absl::UnimplementedError("no push-pulls"));
  }

  Client* client = nullptr;
  int pushes = 0;

 private:
  const std::string address_ = "always-moved";
};

TEST(PlacementRedirectRoundsTest, RedirectsAreFollowedAtMostSixteenTimesACall) {
  auto owned = std::make_unique<AlwaysMovedTransport>();
  AlwaysMovedTransport* transport = owned.get();
  std::vector<std::unique_ptr<Transport>> transports;
  transports.push_back(std::move(owned));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client,
                       Client::Create(ClientOptions(), std::move(transports)));
  transport->client = client.get();
  ASSERT_OK(client->UpdatePlacement(PlacementSpec(1, 1)));
  const absl::Status refused = client->SendGrad("w", Tensor::FromValues<float>({1}, {1}));
  EXPECT_EQ(transport->pushes, Client::kMaxRedirectRounds);
  EXPECT_EQ(PlacementMovedVersion(refused),
            std::optional<uint64_t>(Client::kMaxRedirectRounds + 1))
      << refused;
  EXPECT_THAT(refused.message(), HasSubstr("sent these blocks 16 times"));
  EXPECT_EQ(client->redirects(), static_cast<uint64_t>(Client::kMaxRedirectRounds - 1));
}

void PlacementRoutingTest::TableCallsFollowPlacementMoved() {
  std::unique_ptr<Client> client = NewClient();
  ASSERT_NE(client, nullptr);
  ASSERT_OK(client->UpdatePlacement(PlacementSpec(1, 2)));
  v1::TableConfig config;
  config.set_dim(1);
  config.mutable_optimizer()->mutable_add();
  ASSERT_OK_AND_ASSIGN(Table table, Table::Create(*client, "t", config));
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 64; ++k) keys.push_back(k);
  const std::vector<float> ones(keys.size(), 1.0f);
  ASSERT_OK(table.Push<float>(keys, ones));

  // The rows whose owner changes go to server 2; then every gate follows
  // version 2 for 3 servers: the old owners refuse them.
  const Placement two = Placement::Jump(2, 1);
  const Placement three = Placement::Jump(3, 2);
  int moved = 0;
  for (int s = 0; s < 2; ++s) {
    std::map<std::string, std::string> extensions;
    ASSERT_OK(servers_[s]->tables
                  .ExportRows("t",
                              [&](uint64_t key) {
                                return two.HashKeyServer(key) == s && three.HashKeyServer(key) == 2;
                              },
                              &extensions)
                  .status());
    ASSERT_OK_AND_ASSIGN(uint64_t rows,
                         servers_[2]->tables.ImportRows(
                             extensions,
                             [](const std::string&, const v1::TableConfig&, uint64_t) {
                               return absl::OkStatus();
                             },
                             nullptr));
    moved += static_cast<int>(rows);
  }
  ASSERT_GT(moved, 0);
  for (auto& server : servers_) server->gate.Set(Placement::Jump(3, 2));
  Join(*client);

  // Refused by the old owners under version 2, which the client has not
  // seen: it waits, then sends the refused keys to their new owner.
  std::future<absl::Status> pushed =
      std::async(std::launch::async, [&] { return table.Push<float>(keys, ones); });
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  for (int i = 0; i < 60000 && client->placement_waits() == 0 && absl::Now() < deadline; ++i) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(client->placement_waits(), 1u);
  ASSERT_OK(client->UpdatePlacement(PlacementSpec(2, 3, /*from=*/2)));
  ASSERT_OK(pushed.get());
  EXPECT_GT(client->redirects(), 0u);

  // Each key holds exactly both pushes on its owner under 3; an old owner's
  // copy of a moved key got nothing of the refused push.
  auto stored = [&](int server, uint64_t key) {
    v1::TablePullRequest request;
    request.set_table("t");
    request.set_keys(EncodeKeys({key}));
    v1::TablePullResponse response;
    EXPECT_OK(servers_[server]->tables.Pull(request, &response, absl::Now() + absl::Seconds(5)));
    float value = -1;
    std::memcpy(&value, response.values().data(), sizeof(value));
    return value;
  };
  for (uint64_t key : keys) {
    EXPECT_EQ(stored(three.HashKeyServer(key), key), 2.0f) << "key " << key;
    if (three.HashKeyServer(key) == 2) EXPECT_EQ(stored(two.HashKeyServer(key), key), 1.0f);
  }
  // A read is followed the same way.
  std::vector<float> out(keys.size());
  ASSERT_OK(table.Pull<float>(keys, absl::MakeSpan(out)));
  EXPECT_EQ(out, std::vector<float>(keys.size(), 2.0f));
}

TEST_F(PlacementRoutingTest, TableCallsFollowPlacementMovedAndApplyEachPushOnce) {
  TableCallsFollowPlacementMoved();
  EXPECT_EQ(frames_.load(), 0);
}

// The same by table frames: the old owner's PushTableRows refuses a moved
// key with PlacementMoved inside the exactly-once step (its copy gets
// nothing, the keys go again under a new id), and its PullTableRows refuses
// to read a moved key.
TEST_F(PlacementRoutingTest, TableFramesFollowPlacementMovedAndApplyEachPushOnce) {
  table_frames_ = true;
  TableCallsFollowPlacementMoved();
  EXPECT_GT(frames_.load(), 0);
}

// A table frame to a key handed over is refused by the old owner's
// dispatcher with PlacementMoved and changes nothing there; a frame read of
// it is refused too.
TEST_F(PlacementRoutingTest, TheOldOwnerRefusesTableFramesForAMovedKey) {
  Tables& tables = servers_[0]->tables;
  v1::CreateTableRequest create;
  create.set_name("t");
  create.mutable_config()->set_dim(1);
  create.mutable_config()->mutable_optimizer()->mutable_add();
  ASSERT_OK(tables.Create(create));
  const Placement two = Placement::Jump(2, 1);
  const Placement three = Placement::Jump(3, 2);
  uint64_t key = 0;
  while (!(two.HashKeyServer(key) == 0 && three.HashKeyServer(key) == 2)) ++key;
  ASSERT_LT(key, 1000u);
  servers_[0]->gate.Set(three);
  const std::vector<uint64_t> keys = {key};
  const float one = 1.0f;
  TableRowsView push;
  push.table = "t";
  push.keys = keys;
  push.values = absl::string_view(reinterpret_cast<const char*>(&one), sizeof(one));
  EXPECT_THAT(servers_[0]->dispatcher.PushTableRows(push, /*client_id=*/7, /*sequence=*/1),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr(kPlacementMovedPrefix)));
  TableRowsView pull;
  pull.table = "t";
  pull.keys = keys;
  bool read = false;
  EXPECT_THAT(servers_[0]->dispatcher.PullTableRows(
                  pull,
                  [&](size_t bytes, ElementType) -> absl::StatusOr<absl::Span<char>> {
                    read = true;
                    return absl::InternalError("no rows may be read");
                  }),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr(kPlacementMovedPrefix)));
  EXPECT_FALSE(read);
  // Nothing was applied: the row holds its initial 0 (no gate: read all).
  servers_[0]->dispatcher.SetPlacementGate(nullptr);
  float value = -1;
  ASSERT_OK(servers_[0]->dispatcher.PullTableRows(
      pull, [&](size_t bytes, ElementType) -> absl::StatusOr<absl::Span<char>> {
        EXPECT_EQ(bytes, sizeof(value));
        return absl::MakeSpan(reinterpret_cast<char*>(&value), sizeof(value));
      }));
  EXPECT_EQ(value, 0.0f);
}

}  // namespace
}  // namespace pserver
