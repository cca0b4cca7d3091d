// GoogleTest matchers for absl::Status and absl::StatusOr.
//
//   EXPECT_OK(store.Init(param, config));
//   EXPECT_THAT(store.Get(ref, &out),
//               StatusIs(absl::StatusCode::kNotFound, HasSubstr("'w'")));
//   ASSERT_OK_AND_ASSIGN(Tensor t, client->GetParam("w"));
#ifndef PSERVER_CC_TESTING_STATUS_MATCHERS_H_
#define PSERVER_CC_TESTING_STATUS_MATCHERS_H_

#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver::testing {

inline const absl::Status& GetStatus(const absl::Status& status) { return status; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

MATCHER_P2(StatusIs, code, message_matcher,
           "has code " + absl::StatusCodeToString(code) + " and a message that " +
               ::testing::DescribeMatcher<std::string>(message_matcher)) {
  const absl::Status& status = ::pserver::testing::GetStatus(arg);
  *result_listener << "status is " << status;
  return status.code() == code &&
         ::testing::ExplainMatchResult(message_matcher, std::string(status.message()),
                                       result_listener);
}

MATCHER_P(StatusCodeIs, code, "has code " + absl::StatusCodeToString(code)) {
  const absl::Status& status = ::pserver::testing::GetStatus(arg);
  *result_listener << "status is " << status;
  return status.code() == code;
}

MATCHER(IsOk, "is OK") {
  const absl::Status& status = ::pserver::testing::GetStatus(arg);
  *result_listener << "status is " << status;
  return status.ok();
}

}  // namespace pserver::testing

#define PS_TESTING_CONCAT_INNER_(a, b) a##b
#define PS_TESTING_CONCAT_(a, b) PS_TESTING_CONCAT_INNER_(a, b)

#define EXPECT_OK(expr) EXPECT_THAT((expr), ::pserver::testing::IsOk())
#define ASSERT_OK(expr) ASSERT_THAT((expr), ::pserver::testing::IsOk())

#define ASSERT_OK_AND_ASSIGN(lhs, expr) \
  ASSERT_OK_AND_ASSIGN_IMPL_(PS_TESTING_CONCAT_(ps_statusor_, __LINE__), lhs, expr)
#define ASSERT_OK_AND_ASSIGN_IMPL_(statusor, lhs, expr)          \
  auto statusor = (expr);                                        \
  ASSERT_TRUE(statusor.ok()) << "status is " << statusor.status(); \
  lhs = std::move(statusor).value()

#endif  // PSERVER_CC_TESTING_STATUS_MATCHERS_H_
