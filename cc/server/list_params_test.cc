// ListParams: each server lists the parameters it holds blocks of, a bounded
// page at a time, and Client::ListParams merges them over the cluster.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "cc/client/client.h"
#include "cc/server/dispatcher.h"
#include "cc/server/in_process_transport.h"
#include "cc/server/local_cluster.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::IsOk;

absl::StatusOr<v1::ListParamsResponse> ListPage(Transport& t, const std::string& token,
                                                uint32_t max_entries) {
  v1::ListParamsRequest request;
  request.set_page_token(token);
  request.set_max_entries(max_entries);
  v1::ListParamsResponse response;
  absl::Notification finished;
  absl::Status result;
  t.Call("ListParams", request, &response, absl::Now() + absl::Seconds(60), [&](absl::Status s) {
    result = std::move(s);
    finished.Notify();
  });
  finished.WaitForNotification();
  if (!result.ok()) return result;
  return response;
}

std::vector<std::string> Names(const std::vector<v1::ParamListing>& params) {
  std::vector<std::string> names;
  for (const auto& p : params) names.push_back(p.name());
  return names;
}

TEST(ListParamsTest, ClientMergesEveryServersParametersOnce) {
  ASSERT_OK_AND_ASSIGN(auto cluster, LocalCluster::Start(3, ServerOptions()));
  ClientOptions options;
  options.servers = cluster->addresses();
  options.block_bytes = 64;  // "big" (400 bytes) is split over the servers
  for (bool in_process : {true, false}) {
    SCOPED_TRACE(in_process ? "in process" : "over gRPC");
    absl::StatusOr<std::unique_ptr<Client>> client =
        in_process ? Client::Create(options, InProcessTransports(*cluster)) : Client::Connect(options);
    ASSERT_OK(client.status());
    if (in_process) {
      ASSERT_OK_AND_ASSIGN(std::vector<v1::ParamListing> empty, (*client)->ListParams());
      EXPECT_TRUE(empty.empty());
      v1::ParameterConfig adam;
      adam.mutable_optimizer()->mutable_adam();
      ASSERT_OK((*client)->InitParam("big", Tensor::FromValues<float>({100}, std::vector<float>(100)),
                                     adam));
      ASSERT_OK((*client)->InitParam("a/w", Tensor::FromValues<float>({2, 3}, {1, 2, 3, 4, 5, 6})));
      ASSERT_OK((*client)->InitParam("z", Tensor::FromValues<double>({1}, {7})));
      ASSERT_OK((*client)->FinishInitParams());
    }
    ASSERT_OK_AND_ASSIGN(std::vector<v1::ParamListing> params, (*client)->ListParams());
    ASSERT_THAT(Names(params), ::testing::ElementsAre("a/w", "big", "z"));
    EXPECT_EQ(params[0].type(), v1::FLOAT32);
    EXPECT_THAT(params[0].shape(), ::testing::ElementsAre(2, 3));
    EXPECT_EQ(params[0].optimizer(), "sgd");
    EXPECT_EQ(params[0].blocks_held(), 1u);
    EXPECT_GT(params[1].block_count(), 3u);
    EXPECT_EQ(params[1].blocks_held(), params[1].block_count());  // summed over servers
    EXPECT_EQ(params[1].optimizer(), "adam");
    EXPECT_EQ(params[2].type(), v1::FLOAT64);
  }
  // Each server lists only what it holds: the blocks over servers add up.
  uint32_t big_blocks = 0;
  for (auto& t : InProcessTransports(*cluster)) {
    ASSERT_OK_AND_ASSIGN(v1::ListParamsResponse page, ListPage(*t, "", 0));
    EXPECT_EQ(page.next_page_token(), "");
    for (const auto& p : page.params()) {
      if (p.name() == "big") big_blocks += p.blocks_held();
      EXPECT_GT(p.blocks_held(), 0u) << p.name();
    }
  }
  EXPECT_GT(big_blocks, 3u);
}

TEST(ListParamsTest, PagesAreBoundedByTheRequestAndTheServersCap) {
  ASSERT_OK_AND_ASSIGN(auto cluster, LocalCluster::Start(1, ServerOptions()));
  ClientOptions options;
  options.servers = cluster->addresses();
  ASSERT_OK_AND_ASSIGN(auto client, Client::Create(options, InProcessTransports(*cluster)));
  const int n = static_cast<int>(kMaxListParamsEntries) + 5;
  std::vector<ParamInit> inits;
  for (int i = 0; i < n; ++i) {
    inits.push_back({absl::StrCat("p", 10000 + i), Tensor::FromValues<float>({1}, {0}), {}});
  }
  ASSERT_OK(client->InitParams(inits));
  auto transport = std::move(InProcessTransports(*cluster)[0]);

  // No max_entries, or more than the cap: the cap, and a token to go on.
  for (uint32_t asked : {0u, kMaxListParamsEntries + 1, 1u << 31}) {
    ASSERT_OK_AND_ASSIGN(v1::ListParamsResponse page, ListPage(*transport, "", asked));
    ASSERT_EQ(page.params_size(), static_cast<int>(kMaxListParamsEntries)) << asked;
    EXPECT_EQ(page.params(0).name(), "p10000");
    EXPECT_EQ(page.next_page_token(), page.params(kMaxListParamsEntries - 1).name());
  }
  // Small pages walk every name once, in order.
  std::vector<std::string> walked;
  std::string token;
  for (int pages = 0; pages <= n; ++pages) {
    ASSERT_OK_AND_ASSIGN(v1::ListParamsResponse page, ListPage(*transport, token, 7));
    ASSERT_LE(page.params_size(), 7);
    for (const auto& p : page.params()) walked.push_back(p.name());
    token = page.next_page_token();
    if (token.empty()) break;
  }
  EXPECT_TRUE(token.empty());
  ASSERT_EQ(walked.size(), static_cast<size_t>(n));
  EXPECT_TRUE(std::is_sorted(walked.begin(), walked.end()));
  EXPECT_EQ(walked.back(), absl::StrCat("p", 10000 + n - 1));
  // A token after every name: an empty last page.
  ASSERT_OK_AND_ASSIGN(v1::ListParamsResponse past, ListPage(*transport, "q", 0));
  EXPECT_EQ(past.params_size(), 0);
  EXPECT_EQ(past.next_page_token(), "");
  // The client reads every page.
  ASSERT_OK_AND_ASSIGN(std::vector<v1::ParamListing> all, client->ListParams());
  EXPECT_EQ(Names(all), walked);
}

}  // namespace
}  // namespace pserver
