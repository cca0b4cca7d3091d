// EtcdClient against a real etcd (cc/etcd/testing/etcd_process.h) on free
// 127.0.0.1 ports. Every wait is on a condition with a deadline.
#include "cc/etcd/etcd_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cc/etcd/testing/etcd_process.h"
#include "cc/etcd/testing/fake_endpoints.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::EtcdProcess;
using ::pserver::testing::EtcdProcessOptions;
using ::pserver::testing::StatusCodeIs;
using ::pserver::testing::StatusIs;
using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Polls `condition` until it holds or `timeout` passes; true if it held.
template <typename Condition>
bool WaitFor(Condition condition, absl::Duration timeout,
             absl::Duration poll = absl::Milliseconds(50)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    if (condition()) return true;
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(poll);
  }
}

// A port on 127.0.0.1 that nothing listens on (bound once, then released).
int UnusedPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    if (fd >= 0) close(fd);
    return 0;
  }
  close(fd);
  return ntohs(address.sin_port);
}

// Collects watch events; lets a test wait for a number of them.
class EventLog {
 public:
  WatchCallback Callback() {
    return [this](const WatchEvent& event) {
      absl::MutexLock lock(&mu_);
      events_.push_back(event);
    };
  }
  // True once at least `count` events arrived, within `timeout`.
  bool WaitForCount(size_t count, absl::Duration timeout = absl::Seconds(10)) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return events_.size() >= count; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }
  std::vector<WatchEvent> events() const {
    absl::MutexLock lock(&mu_);
    return events_;
  }
  // "PUT key=value" / "DELETE key", in order.
  std::vector<std::string> Summary() const {
    std::vector<std::string> out;
    for (const WatchEvent& event : events()) {
      out.push_back(event.type == WatchEvent::Type::kPut
                        ? absl::StrCat("PUT ", event.kv.key, "=", event.kv.value)
                        : absl::StrCat("DELETE ", event.kv.key));
    }
    return out;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<WatchEvent> events_ ABSL_GUARDED_BY(mu_);
};

class EtcdClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(etcd_, EtcdProcess::Start());
    ASSERT_OK_AND_ASSIGN(client_, Connect({etcd_->endpoint()}));
  }

  void TearDown() override {
    client_.reset();
    if (etcd_ != nullptr) {
      EXPECT_OK(etcd_->Stop());
    }
  }

  absl::StatusOr<std::unique_ptr<EtcdClient>> Connect(std::vector<std::string> endpoints,
                                                      absl::Duration timeout = absl::Seconds(5),
                                                      std::string prefix = "/test") {
    EtcdClientOptions options;
    options.endpoints = std::move(endpoints);
    options.timeout = timeout;
    options.prefix = std::move(prefix);
    return EtcdClient::Connect(options);
  }

  bool KeyGone(absl::string_view key) {
    return client_->Get(key).status().code() == absl::StatusCode::kNotFound;
  }

  std::unique_ptr<EtcdProcess> etcd_;
  std::unique_ptr<EtcdClient> client_;
};

TEST_F(EtcdClientTest, PutGetDelete) {
  ASSERT_OK(client_->Put("/a", "1"));
  ASSERT_OK_AND_ASSIGN(KeyValue kv, client_->Get("/a"));
  EXPECT_EQ(kv.key, "/a");
  EXPECT_EQ(kv.value, "1");
  EXPECT_GT(kv.mod_revision, 0);
  EXPECT_EQ(kv.create_revision, kv.mod_revision);
  EXPECT_EQ(kv.version, 1);
  EXPECT_EQ(kv.lease, 0);

  ASSERT_OK(client_->Put("/a", "2"));
  ASSERT_OK_AND_ASSIGN(KeyValue again, client_->Get("/a"));
  EXPECT_EQ(again.value, "2");
  EXPECT_EQ(again.version, 2);
  EXPECT_EQ(again.create_revision, kv.create_revision);
  EXPECT_GT(again.mod_revision, kv.mod_revision);
  ASSERT_OK_AND_ASSIGN(int64_t revision, client_->Revision());
  EXPECT_EQ(revision, again.mod_revision);

  ASSERT_OK(client_->Delete("/a"));
  EXPECT_THAT(client_->Get("/a"),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("etcd get /test/a on " + etcd_->endpoint()),
                             HasSubstr("not found"))));
  EXPECT_OK(client_->Delete("/a"));  // deleting a missing key is fine
  EXPECT_OK(client_->Put("", "x"));  // the key is the prefix itself, "/test"
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<EtcdClient> bare,
                       Connect({etcd_->endpoint()}, absl::Seconds(5), ""));
  EXPECT_THAT(bare->Put("", "x"), StatusCodeIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(EtcdClientTest, GetPrefixAndDeletePrefix) {
  ASSERT_OK(client_->Put("/p/b", "2"));
  ASSERT_OK(client_->Put("/p/a", "1"));
  ASSERT_OK(client_->Put("/p/c", "3"));
  ASSERT_OK(client_->Put("/q", "other"));
  int64_t revision = 0;
  ASSERT_OK_AND_ASSIGN(std::vector<KeyValue> kvs, client_->GetPrefix("/p/", &revision));
  ASSERT_EQ(kvs.size(), 3u);
  EXPECT_EQ(kvs[0].key, "/p/a");
  EXPECT_EQ(kvs[0].value, "1");
  EXPECT_EQ(kvs[1].key, "/p/b");
  EXPECT_EQ(kvs[2].key, "/p/c");
  EXPECT_EQ(kvs[2].value, "3");
  for (const KeyValue& kv : kvs) {
    EXPECT_LE(kv.mod_revision, revision);
    EXPECT_EQ(kv.lease, 0);
  }

  // The client's prefix is really a prefix of the stored keys.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<EtcdClient> bare,
                       Connect({etcd_->endpoint()}, absl::Seconds(5), ""));
  ASSERT_OK_AND_ASSIGN(KeyValue raw, bare->Get("/test/p/a"));
  EXPECT_EQ(raw.value, "1");
  ASSERT_OK_AND_ASSIGN(std::vector<KeyValue> everything, bare->GetPrefix(""));
  EXPECT_EQ(everything.size(), 4u);

  ASSERT_OK(client_->DeletePrefix("/p/"));
  ASSERT_OK_AND_ASSIGN(std::vector<KeyValue> left, client_->GetPrefix("/p/"));
  EXPECT_THAT(left, IsEmpty());
  ASSERT_OK_AND_ASSIGN(KeyValue q, client_->Get("/q"));
  EXPECT_EQ(q.value, "other");
}

TEST_F(EtcdClientTest, TxnComparesAndBranches) {
  ASSERT_OK(client_->Put("/cas", "old"));
  ASSERT_OK_AND_ASSIGN(KeyValue before, client_->Get("/cas"));

  // Compare-and-swap on the value: the first swap wins, the second sees "new".
  ASSERT_OK_AND_ASSIGN(
      TxnResult swapped,
      client_->Txn({Compare::ValueEquals("/cas", "old")},
                   {TxnOp::Put("/cas", "new"), TxnOp::Get("/cas")}, {TxnOp::Get("/cas")}));
  EXPECT_TRUE(swapped.succeeded);
  ASSERT_EQ(swapped.results.size(), 2u);
  ASSERT_EQ(swapped.results[1].kvs.size(), 1u);
  EXPECT_EQ(swapped.results[1].kvs[0].value, "new");
  EXPECT_EQ(swapped.results[1].kvs[0].key, "/cas");

  ASSERT_OK_AND_ASSIGN(TxnResult lost,
                       client_->Txn({Compare::ValueEquals("/cas", "old")},
                                    {TxnOp::Put("/cas", "newer")}, {TxnOp::Get("/cas")}));
  EXPECT_FALSE(lost.succeeded);
  ASSERT_EQ(lost.results.size(), 1u);
  ASSERT_EQ(lost.results[0].kvs.size(), 1u);
  EXPECT_EQ(lost.results[0].kvs[0].value, "new");

  // On mod_revision: a stale revision fails, the current one succeeds.
  ASSERT_OK_AND_ASSIGN(TxnResult stale,
                       client_->Txn({Compare::ModRevisionEquals("/cas", before.mod_revision)},
                                    {TxnOp::Delete("/cas")}));
  EXPECT_FALSE(stale.succeeded);
  ASSERT_OK_AND_ASSIGN(KeyValue now, client_->Get("/cas"));
  ASSERT_OK_AND_ASSIGN(TxnResult fresh,
                       client_->Txn({Compare::ModRevisionEquals("/cas", now.mod_revision),
                                     Compare::KeyExists("/cas")},
                                    {TxnOp::Delete("/cas")}));
  EXPECT_TRUE(fresh.succeeded);
  ASSERT_EQ(fresh.results.size(), 1u);
  EXPECT_EQ(fresh.results[0].deleted, 1);
  EXPECT_GT(fresh.revision, now.mod_revision);
  EXPECT_TRUE(KeyGone("/cas"));

  // Prefix operations inside a transaction.
  ASSERT_OK(client_->Put("/t/1", "a"));
  ASSERT_OK(client_->Put("/t/2", "b"));
  ASSERT_OK_AND_ASSIGN(TxnResult listed,
                       client_->Txn({}, {TxnOp::GetPrefix("/t/"), TxnOp::DeletePrefix("/t/")}));
  EXPECT_TRUE(listed.succeeded);
  ASSERT_EQ(listed.results.size(), 2u);
  ASSERT_EQ(listed.results[0].kvs.size(), 2u);
  EXPECT_EQ(listed.results[0].kvs[0].key, "/t/1");
  EXPECT_EQ(listed.results[1].deleted, 2);
}

TEST_F(EtcdClientTest, PutIfAbsentRaceHasExactlyOneWinner) {
  constexpr int kThreads = 4;
  for (int round = 0; round < 5; ++round) {
    const std::string key = absl::StrCat("/ps/", round);
    absl::Notification go;
    std::atomic<int> winners{0};
    std::atomic<int> errors{0};
    std::vector<int> won(kThreads, 0);
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i) {
      threads.emplace_back([&, i] {
        go.WaitForNotification();
        absl::StatusOr<bool> claimed = client_->PutIfAbsent(key, absl::StrCat("thread-", i));
        if (!claimed.ok()) {
          ++errors;
        } else if (*claimed) {
          ++winners;
          won[i] = 1;
        }
      });
    }
    go.Notify();
    for (std::thread& thread : threads) thread.join();
    EXPECT_EQ(errors.load(), 0);
    ASSERT_EQ(winners.load(), 1) << "round " << round;
    int winner = 0;
    while (won[winner] == 0) ++winner;
    ASSERT_OK_AND_ASSIGN(KeyValue kv, client_->Get(key));
    EXPECT_EQ(kv.value, absl::StrCat("thread-", winner));
    EXPECT_EQ(kv.version, 1);
  }
}

TEST_F(EtcdClientTest, PutIfAbsentWithLeaseRecognizesItsOwnClaim) {
  ASSERT_OK_AND_ASSIGN(int64_t mine, client_->Grant(absl::Seconds(30)));
  ASSERT_OK_AND_ASSIGN(int64_t theirs, client_->Grant(absl::Seconds(30)));
  ASSERT_OK_AND_ASSIGN(bool first, client_->PutIfAbsent("/ps/0", "10.0.0.1:7000", mine));
  EXPECT_TRUE(first);
  ASSERT_OK_AND_ASSIGN(bool repeat, client_->PutIfAbsent("/ps/0", "10.0.0.1:7000", mine));
  EXPECT_TRUE(repeat);  // as after a retry whose first reply was lost
  ASSERT_OK_AND_ASSIGN(bool other, client_->PutIfAbsent("/ps/0", "10.0.0.1:7000", theirs));
  EXPECT_FALSE(other);
  ASSERT_OK_AND_ASSIGN(bool no_lease, client_->PutIfAbsent("/ps/0", "10.0.0.1:7000"));
  EXPECT_FALSE(no_lease);
  ASSERT_OK_AND_ASSIGN(KeyValue kv, client_->Get("/ps/0"));
  EXPECT_EQ(kv.lease, mine);
}

TEST_F(EtcdClientTest, LeaseExpiryRemovesKey) {
  ASSERT_OK_AND_ASSIGN(int64_t lease, client_->Grant(absl::Seconds(1)));
  ASSERT_OK(client_->Put("/leased", "x", lease));
  ASSERT_OK_AND_ASSIGN(KeyValue kv, client_->Get("/leased"));
  EXPECT_EQ(kv.lease, lease);
  // etcd's minimum TTL is about 2 s; it expires within a few seconds.
  EXPECT_TRUE(WaitFor([&] { return KeyGone("/leased"); }, absl::Seconds(15)))
      << "key still there 15 s after a 1 s lease";
  EXPECT_THAT(client_->KeepAliveOnce(lease),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("etcd keep-alive lease")));
}

TEST_F(EtcdClientTest, KeepAliveKeepsLeaseAlivePastSeveralTtls) {
  ASSERT_OK_AND_ASSIGN(int64_t lease, client_->Grant(absl::Seconds(2)));
  ASSERT_OK(client_->Put("/kept", "x", lease));
  ASSERT_OK_AND_ASSIGN(absl::Duration ttl, client_->KeepAliveOnce(lease));
  EXPECT_GE(ttl, absl::Seconds(1));
  EXPECT_LE(ttl, absl::Seconds(5));
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<LeaseKeeper> keeper, client_->KeepAlive(lease));
    EXPECT_EQ(keeper->lease(), lease);
    EXPECT_EQ(keeper->ttl(), ttl);
    // Three TTLs: without renewals the key would be gone after one.
    const absl::Time until = absl::Now() + 3 * ttl;
    while (absl::Now() < until) {
      ASSERT_OK(client_->Get("/kept").status()) << "lost the key while kept alive";
      absl::SleepFor(absl::Milliseconds(100));
    }
    EXPECT_OK(keeper->status());
  }
  // Destroyed keeper: no more renewals, so the lease runs out.
  EXPECT_TRUE(WaitFor([&] { return KeyGone("/kept"); }, ttl + absl::Seconds(10)));
}

TEST_F(EtcdClientTest, KeeperReportsRevokedLease) {
  ASSERT_OK_AND_ASSIGN(int64_t lease, client_->Grant(absl::Seconds(3)));
  absl::Notification lost;
  absl::Status lost_status;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<LeaseKeeper> keeper,
                       client_->KeepAlive(lease, [&](const absl::Status& status) {
                         lost_status = status;
                         lost.Notify();
                       }));
  ASSERT_OK(client_->Revoke(lease));
  // The next renewal (a third of the TTL later) finds it gone.
  ASSERT_TRUE(lost.WaitForNotificationWithTimeout(absl::Seconds(15)));
  EXPECT_THAT(lost_status, StatusCodeIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(keeper->status(), StatusCodeIs(absl::StatusCode::kNotFound));
}

TEST_F(EtcdClientTest, RevokeDeletesKeysAtOnce) {
  ASSERT_OK_AND_ASSIGN(int64_t lease, client_->Grant(absl::Seconds(60)));
  ASSERT_OK(client_->Put("/r/1", "a", lease));
  ASSERT_OK(client_->Put("/r/2", "b", lease));
  ASSERT_OK(client_->Revoke(lease));
  EXPECT_TRUE(KeyGone("/r/1"));
  EXPECT_TRUE(KeyGone("/r/2"));
  EXPECT_THAT(client_->Revoke(lease), StatusCodeIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(client_->KeepAlive(lease), StatusCodeIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(client_->Put("/r/3", "c", lease), StatusCodeIs(absl::StatusCode::kNotFound));
}

TEST_F(EtcdClientTest, WatchSeesPutsAndDeletesInOrder) {
  EventLog log;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Watcher> watcher, client_->Watch("/w/", 0, log.Callback()));
  ASSERT_OK(client_->Put("/w/a", "1"));
  ASSERT_OK(client_->Put("/w/b", "2"));
  ASSERT_OK(client_->Put("/elsewhere", "ignored"));
  ASSERT_OK(client_->Put("/w/a", "3"));
  ASSERT_OK(client_->Delete("/w/a"));
  ASSERT_OK(client_->Put("/w/z", "last"));
  ASSERT_TRUE(log.WaitForCount(5)) << ::testing::PrintToString(log.Summary());
  EXPECT_THAT(log.Summary(), ElementsAre("PUT /w/a=1", "PUT /w/b=2", "PUT /w/a=3", "DELETE /w/a",
                                         "PUT /w/z=last"));
  std::vector<WatchEvent> events = log.events();
  for (size_t i = 1; i < events.size(); ++i) {
    EXPECT_GT(events[i].kv.mod_revision, events[i - 1].kv.mod_revision);
  }
  EXPECT_EQ(watcher->last_revision(), events.back().kv.mod_revision);
  EXPECT_OK(watcher->status());
}

TEST_F(EtcdClientTest, WatchFromRevisionReplaysHistory) {
  ASSERT_OK(client_->Put("/h/a", "1"));
  ASSERT_OK_AND_ASSIGN(KeyValue first, client_->Get("/h/a"));
  ASSERT_OK(client_->Put("/h/a", "2"));
  ASSERT_OK(client_->Delete("/h/a"));
  EventLog log;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Watcher> watcher,
                       client_->Watch("/h/", first.mod_revision, log.Callback()));
  ASSERT_TRUE(log.WaitForCount(3));
  EXPECT_THAT(log.Summary(), ElementsAre("PUT /h/a=1", "PUT /h/a=2", "DELETE /h/a"));
}

TEST_F(EtcdClientTest, WatchFromCompactedRevisionIsOutOfRange) {
  ASSERT_OK(client_->Put("/c/a", "1"));
  ASSERT_OK_AND_ASSIGN(KeyValue first, client_->Get("/c/a"));
  ASSERT_OK(client_->Put("/c/a", "2"));
  ASSERT_OK(client_->Put("/c/a", "3"));
  ASSERT_OK_AND_ASSIGN(int64_t revision, client_->Revision());
  ASSERT_OK(client_->Compact(revision));
  EXPECT_THAT(client_->Compact(first.mod_revision),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("etcd compact")));
  const auto compacted = StatusIs(absl::StatusCode::kOutOfRange,
                                  AllOf(HasSubstr("etcd watch /test/c/"), HasSubstr("compacted")));
  absl::Notification ended;
  absl::Status ended_status;
  absl::StatusOr<std::unique_ptr<Watcher>> stale = client_->Watch(
      "/c/", first.mod_revision, [](const WatchEvent&) { ADD_FAILURE() << "no event expected"; },
      [&](const absl::Status& status) {
        ended_status = status;
        ended.Notify();
      });
  if (stale.ok()) {
    // etcd 3.4 confirms the watch first, then ends it.
    ASSERT_TRUE(ended.WaitForNotificationWithTimeout(absl::Seconds(10)));
    EXPECT_THAT(ended_status, compacted);
    EXPECT_THAT((*stale)->status(), compacted);
  } else {
    EXPECT_THAT(stale, compacted);
  }
  // From the compaction point on, the history is there.
  EventLog log;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Watcher> watcher,
                       client_->Watch("/c/", revision, log.Callback()));
  ASSERT_TRUE(log.WaitForCount(1));
  EXPECT_THAT(log.Summary(), ElementsAre("PUT /c/a=3"));
}

TEST_F(EtcdClientTest, WatcherOutlivesClient) {
  EventLog log;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Watcher> watcher, client_->Watch("/o/", 0, log.Callback()));
  ASSERT_OK_AND_ASSIGN(int64_t lease, client_->Grant(absl::Seconds(30)));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<LeaseKeeper> keeper, client_->KeepAlive(lease));
  client_.reset();
  ASSERT_OK_AND_ASSIGN(client_, Connect({etcd_->endpoint()}));
  ASSERT_OK(client_->Put("/o/x", "1"));
  ASSERT_TRUE(log.WaitForCount(1));
  EXPECT_THAT(log.Summary(), ElementsAre("PUT /o/x=1"));
  EXPECT_OK(keeper->status());
}

TEST_F(EtcdClientTest, SameClientWorksAfterEtcdRestartsAndWatchResumes) {
  EventLog log;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Watcher> watcher, client_->Watch("/r/", 0, log.Callback()));
  ASSERT_OK(client_->Put("/r/a", "1"));
  ASSERT_TRUE(log.WaitForCount(1));

  ASSERT_OK(etcd_->Kill());
  // While it is down, calls fail within their deadline.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<EtcdClient> impatient,
                       Connect({etcd_->endpoint()}, absl::Milliseconds(500)));
  EXPECT_THAT(impatient->Get("/r/a"), AnyOf(StatusCodeIs(absl::StatusCode::kUnavailable),
                                            StatusCodeIs(absl::StatusCode::kDeadlineExceeded)));
  // A call made while etcd is down succeeds once it is back, within its deadline.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<EtcdClient> patient,
                       Connect({etcd_->endpoint()}, absl::Seconds(60)));
  absl::Status during;
  std::thread writer([&] { during = patient->Put("/r/during", "x"); });

  ASSERT_OK(etcd_->Restart());  // same ports, same data directory
  writer.join();
  EXPECT_OK(during);

  // The same client, with no reconnect of its own: the data survived. Its
  // connection attempt may have begun while etcd was still starting (TCP
  // accepted, no HTTP/2 answer yet), which gRPC gives up on only after its
  // connect timeout: on a busy machine the first call can then fail within
  // its 5 s, so the client is given a bounded number of calls (at most 60 s).
  absl::StatusOr<KeyValue> kv = client_->Get("/r/a");
  for (int attempt = 0; attempt < 12 && absl::IsUnavailable(kv.status()); ++attempt) {
    kv = client_->Get("/r/a");
  }
  ASSERT_OK(kv.status());
  EXPECT_EQ(kv->value, "1");
  ASSERT_OK(client_->Put("/r/b", "2"));
  // The watch resumed after /r/a=1: nothing repeated, nothing missed.
  ASSERT_TRUE(log.WaitForCount(3)) << ::testing::PrintToString(log.Summary());
  EXPECT_THAT(log.Summary(), ElementsAre("PUT /r/a=1", "PUT /r/during=x", "PUT /r/b=2"));
  EXPECT_OK(watcher->status());
}

// A client made before its etcd is up (its first connection refused) reaches
// it once it serves. gRPC 1.51's fail-fast calls left nothing polling the
// client's reconnection attempts, so such a client timed out every attempt
// for as long as it lived, while a new client got in at once.
TEST_F(EtcdClientTest, ClientMadeBeforeEtcdStartsReachesItOnceItServes) {
  EtcdProcessOptions later;
  later.name = "later";
  later.client_port = UnusedPort();
  later.peer_port = UnusedPort();
  // Not waited for by EtcdProcess: its own client's polling would drive this
  // process's other connections too, and hide the bug.
  later.wait_until_serving = false;
  ASSERT_GT(later.client_port, 0);
  ASSERT_GT(later.peer_port, 0);
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<EtcdClient> early,
      Connect({absl::StrCat("127.0.0.1:", later.client_port)}, absl::Seconds(2)));
  EXPECT_THAT(early->Get("/x"), StatusCodeIs(absl::StatusCode::kUnavailable));

  ASSERT_OK_AND_ASSIGN(std::unique_ptr<EtcdProcess> etcd, EtcdProcess::Start(later));
  // Each call may take its 2 s; a bounded number of them, 60 s in all on a
  // loaded machine (etcd itself serves within a second or two).
  absl::Status put = early->Put("/x", "1");
  for (int attempt = 0; attempt < 30 && !put.ok(); ++attempt) put = early->Put("/x", "1");
  EXPECT_OK(put);
  EXPECT_OK(etcd->Stop());
}

TEST_F(EtcdClientTest, UnreachableEndpointFailsWithinTimeout) {
  const int port = UnusedPort();
  ASSERT_GT(port, 0);
  const std::string dead = absl::StrCat("127.0.0.1:", port);
  const absl::Duration timeout = absl::Seconds(1);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<EtcdClient> client, Connect({dead}, timeout));
  const auto unreachable = AnyOf(StatusCodeIs(absl::StatusCode::kUnavailable),
                                 StatusCodeIs(absl::StatusCode::kDeadlineExceeded));

  absl::Time start = absl::Now();
  absl::Status status = client->Get("/x").status();
  absl::Duration elapsed = absl::Now() - start;
  EXPECT_THAT(status, unreachable);
  EXPECT_THAT(status.message(), HasSubstr("etcd get /test/x on " + dead));
  EXPECT_THAT(status.message(), HasSubstr("not reachable: connection refused"));
  EXPECT_LT(elapsed, timeout + absl::Seconds(1));

  start = absl::Now();
  EXPECT_THAT(client->Put("/x", "1"), unreachable);
  EXPECT_THAT(client->Grant(absl::Seconds(5)), unreachable);
  EXPECT_THAT(client->Watch("/x", 0, [](const WatchEvent&) {}), unreachable);
  EXPECT_LT(absl::Now() - start, 3 * (timeout + absl::Seconds(1)));
}

TEST_F(EtcdClientTest, FailsOverToTheNextEndpoint) {
  const std::string dead = absl::StrCat("127.0.0.1:", UnusedPort());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<EtcdClient> client,
                       Connect({dead, etcd_->endpoint()}, absl::Seconds(5)));
  ASSERT_OK(client->Put("/f", "1"));
  ASSERT_OK_AND_ASSIGN(KeyValue kv, client->Get("/f"));
  EXPECT_EQ(kv.value, "1");
  EventLog log;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Watcher> watcher, client->Watch("/f", 0, log.Callback()));
  ASSERT_OK(client->Put("/f", "2"));
  ASSERT_TRUE(log.WaitForCount(1));
  EXPECT_THAT(log.Summary(), ElementsAre("PUT /f=2"));
}

// ---- endpoints that are not etcd: every call ends by its timeout, saying why --

absl::StatusOr<std::unique_ptr<EtcdClient>> ClientOf(const std::string& endpoint,
                                                     absl::Duration timeout) {
  EtcdClientOptions options;
  options.endpoints = {endpoint};
  options.timeout = timeout;
  options.prefix = "/test";
  return EtcdClient::Connect(options);
}

// Runs every kind of call against `client` (whose timeout is `timeout`): each
// fails within timeout + a generous margin, naming `endpoint` and `cause`.
void ExpectEveryCallFailsInTime(EtcdClient& client, absl::Duration timeout,
                                const std::string& endpoint, const std::string& cause) {
  const auto fails = [&](absl::Status status, const char* what) {
    EXPECT_THAT(status, AnyOf(StatusCodeIs(absl::StatusCode::kUnavailable),
                              StatusCodeIs(absl::StatusCode::kDeadlineExceeded)))
        << what;
    EXPECT_THAT(std::string(status.message()), AllOf(HasSubstr(endpoint), HasSubstr(cause)))
        << what;
  };
  const absl::Duration bound = timeout + absl::Seconds(2);  // the old code: no longer
  absl::Time start = absl::Now();
  fails(client.Get("/x").status(), "get");
  EXPECT_LT(absl::Now() - start, bound);
  start = absl::Now();
  fails(client.Put("/x", "1"), "put");
  EXPECT_LT(absl::Now() - start, bound);
  start = absl::Now();
  fails(client.GetPrefix("/").status(), "get prefix");
  EXPECT_LT(absl::Now() - start, bound);
  start = absl::Now();
  fails(client.Grant(absl::Seconds(5)).status(), "grant");
  EXPECT_LT(absl::Now() - start, bound);
  start = absl::Now();
  fails(client.KeepAliveOnce(1).status(), "keep-alive");
  EXPECT_LT(absl::Now() - start, bound);
  start = absl::Now();
  fails(client.Txn({Compare::KeyMissing("/x")}, {TxnOp::Put("/x", "1")}).status(), "txn");
  EXPECT_LT(absl::Now() - start, bound);
  start = absl::Now();
  fails(client.Watch("/x", 0, [](const WatchEvent&) {}).status(), "watch");
  EXPECT_LT(absl::Now() - start, bound);
}

TEST(EtcdUnreachableTest, ClosedPortSaysConnectionRefused) {
  ::pserver::testing::ClosedPort closed;
  ASSERT_GT(closed.port(), 0);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<EtcdClient> client,
                       ClientOf(closed.address(), absl::Seconds(1)));
  ExpectEveryCallFailsInTime(*client, absl::Seconds(1), closed.address(), "refused");
}

TEST(EtcdUnreachableTest, SilentListenerSaysNoConnection) {
  ::pserver::testing::SilentListener silent;
  ASSERT_GT(silent.port(), 0);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<EtcdClient> client,
                       ClientOf(silent.address(), absl::Seconds(1)));
  ExpectEveryCallFailsInTime(*client, absl::Seconds(1), silent.address(), "no connection");
}

TEST(EtcdUnreachableTest, HttpServerSaysNotGrpc) {
  ::pserver::testing::GarbageServer http("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
  ASSERT_GT(http.port(), 0);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<EtcdClient> client,
                       ClientOf(http.address(), absl::Seconds(1)));
  const absl::Status status = client->Get("/x").status();
  EXPECT_THAT(status, AnyOf(StatusCodeIs(absl::StatusCode::kUnavailable),
                            StatusCodeIs(absl::StatusCode::kDeadlineExceeded)));
  EXPECT_THAT(std::string(status.message()),
              AllOf(HasSubstr(http.address()), HasSubstr("not a gRPC")));
}

TEST(EtcdUnreachableTest, ReadsEndByAnEarlierDeadline) {
  ::pserver::testing::SilentListener silent;
  ASSERT_GT(silent.port(), 0);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<EtcdClient> client,
                       ClientOf(silent.address(), absl::Seconds(60)));
  const auto unreachable =
      AnyOf(StatusIs(absl::StatusCode::kUnavailable, HasSubstr(silent.address())),
            StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr(silent.address())));
  absl::Time start = absl::Now();
  EXPECT_THAT(client->Get("/x", start + absl::Seconds(1)), unreachable);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));  // not the client's 60 s
  start = absl::Now();
  EXPECT_THAT(client->GetPrefix("/", nullptr, start + absl::Seconds(1)), unreachable);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST(EtcdClientOptionsTest, RejectsBadOptions) {
  EtcdClientOptions options;
  EXPECT_THAT(EtcdClient::Connect(options), StatusCodeIs(absl::StatusCode::kInvalidArgument));
  options.endpoints = {"no-port"};
  EXPECT_THAT(EtcdClient::Connect(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no-port")));
  options.endpoints = {"https://127.0.0.1:2379"};
  EXPECT_THAT(EtcdClient::Connect(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("TLS")));
  options.endpoints = {"http://127.0.0.1:2379"};
  EXPECT_OK(EtcdClient::Connect(options));
  options.timeout = absl::ZeroDuration();
  EXPECT_THAT(EtcdClient::Connect(options), StatusCodeIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace pserver
