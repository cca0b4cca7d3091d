// Tables with values on the wire in float16/bfloat16 (cc/core/table_wire.h):
// pushes widened before they apply (and before BSP holds them back), reads
// narrowed, bad types and lengths refused naming the table with nothing
// applied, and configs checked at creation.
#include "cc/core/table_wire.h"

#include <cstring>
#include <string>
#include <vector>

#include "cc/core/compression.h"
#include "cc/core/status_macros.h"
#include "cc/core/table_keys.h"
#include "cc/core/tables.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::IsOk;
using ::pserver::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class TableWireTest : public ::testing::Test {
 protected:
  absl::Status Create(const std::string& name, ElementType type, uint32_t dim = 2) {
    v1::CreateTableRequest request;
    request.set_name(name);
    request.mutable_config()->set_dim(dim);
    request.mutable_config()->set_element_type(type);
    request.mutable_config()->mutable_optimizer()->mutable_sgd()->set_learning_rate(1.0);
    return tables_.Create(request);
  }

  absl::Status Push(const std::string& table, const std::vector<uint64_t>& keys,
                    const std::vector<float>& grads, ElementType type) {
    v1::TablePushRequest request;
    request.set_table(table);
    request.set_keys(EncodeKeys(keys));
    std::string values(grads.size() * ElementSize(type), '\0');
    EncodeFloats(type, grads.data(), grads.size(), values.data());
    request.set_values(values);
    request.set_value_type(type);
    return tables_.Push(request, nullptr);
  }

  absl::StatusOr<v1::TablePullResponse> Pull(const std::string& table,
                                             const std::vector<uint64_t>& keys, ElementType wire) {
    v1::TablePullRequest request;
    request.set_table(table);
    request.set_keys(EncodeKeys(keys));
    request.set_wire_type(wire);
    v1::TablePullResponse response;
    PS_RETURN_IF_ERROR(tables_.Pull(request, &response, absl::Now() + absl::Seconds(5)));
    return response;
  }

  std::vector<float> Floats(const v1::TablePullResponse& response) {
    const ElementType type = response.content_type() == v1::ELEMENT_TYPE_UNSPECIFIED
                                 ? v1::FLOAT32
                                 : response.content_type();
    std::vector<float> out(response.values().size() / ElementSize(type));
    DecodeFloats(type, response.values().data(), out.size(), out.data());
    return out;
  }

  Tables tables_{TablesOptions()};
};

TEST_F(TableWireTest, HalfPushesApplyAndReadsNarrow) {
  ASSERT_THAT(Create("t", v1::FLOAT32), IsOk());
  for (ElementType type : {v1::FLOAT16, v1::BFLOAT16, v1::FLOAT32}) {
    ASSERT_THAT(Push("t", {4, 9}, {0.5f, -1.0f, 2.0f, 0.25f}, type), IsOk());
  }
  // SGD with lr 1, three times: values -3 * grad.
  for (ElementType wire : {v1::FLOAT16, v1::BFLOAT16, v1::ELEMENT_TYPE_UNSPECIFIED}) {
    absl::StatusOr<v1::TablePullResponse> rows = Pull("t", {9, 4}, wire);
    ASSERT_THAT(rows.status(), IsOk());
    EXPECT_EQ(rows->content_type(), wire);
    EXPECT_EQ(rows->values().size(),
              4 * ElementSize(wire == v1::ELEMENT_TYPE_UNSPECIFIED ? v1::FLOAT32 : wire));
    EXPECT_THAT(Floats(*rows), ElementsAre(-6.0f, -0.75f, -1.5f, 3.0f));
  }
}

TEST_F(TableWireTest, BadTypesAndLengthsAreRefusedAndChangeNothing) {
  ASSERT_THAT(Create("t", v1::FLOAT32), IsOk());
  ASSERT_THAT(Create("d", v1::FLOAT64), IsOk());
  v1::TablePushRequest short_push;
  short_push.set_table("t");
  short_push.set_keys(EncodeKeys({1}));
  short_push.set_values(std::string(3, '\0'));  // 2 float16 values are 4 bytes
  short_push.set_value_type(v1::FLOAT16);
  EXPECT_THAT(tables_.Push(short_push, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("push to table 't': 3 bytes received, 4 expected")));
  EXPECT_THAT(Push("d", {1}, {1.0f, 1.0f}, v1::FLOAT16),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("push to table 'd': value_type float16 is not possible for a "
                                 "float64 table")));
  EXPECT_THAT(Push("t", {1}, {1.0f, 1.0f}, v1::INT32),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("value_type int32")));
  EXPECT_THAT(Pull("d", {1}, v1::BFLOAT16).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("read of table 'd': wire_type bfloat16 is not possible")));
  absl::StatusOr<v1::TablePullResponse> rows = Pull("t", {1}, v1::ELEMENT_TYPE_UNSPECIFIED);
  ASSERT_THAT(rows.status(), IsOk());
  EXPECT_THAT(Floats(*rows), ElementsAre(0.0f, 0.0f));  // nothing applied
}

TEST_F(TableWireTest, BspHoldsTheWidenedAdd) {
  v1::CreateTableRequest request;
  request.set_name("kv");
  request.mutable_config()->set_dim(1);
  request.mutable_config()->mutable_optimizer()->mutable_add();
  request.mutable_config()->mutable_consistency()->set_model(v1::Consistency::BSP);
  ASSERT_THAT(tables_.Create(request), IsOk());
  v1::ClockRequest join;
  join.set_table("kv");
  join.set_worker("w");
  join.set_op(v1::ClockRequest::JOIN);
  ASSERT_THAT(tables_.Clock(join).status(), IsOk());
  v1::TablePushRequest push;
  push.set_table("kv");
  push.set_keys(EncodeKeys({3}));
  const float value = 1.5f;
  std::string half(2, '\0');
  EncodeFloats(v1::BFLOAT16, &value, 1, half.data());
  push.set_values(half);
  push.set_value_type(v1::BFLOAT16);
  push.set_worker("w");
  ASSERT_THAT(tables_.Push(push, nullptr), IsOk());  // held back until the clock
  v1::ClockRequest tick = join;
  tick.set_op(v1::ClockRequest::TICK);
  ASSERT_THAT(tables_.Clock(tick).status(), IsOk());
  absl::StatusOr<v1::TablePullResponse> rows = Pull("kv", {3}, v1::ELEMENT_TYPE_UNSPECIFIED);
  ASSERT_THAT(rows.status(), IsOk());
  EXPECT_THAT(Floats(*rows), ElementsAre(1.5f));
}

TEST_F(TableWireTest, ConfigIsCheckedAtCreation) {
  v1::CreateTableRequest request;
  request.set_name("bad");
  request.mutable_config()->set_dim(1);
  request.mutable_config()->mutable_wire_compression()->set_topk_fraction(1.5);
  EXPECT_THAT(tables_.Create(request),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("table 'bad': wire_compression.topk_fraction must be in [0, 1]")));
  request.mutable_config()->mutable_wire_compression()->set_topk_fraction(0.5);
  request.mutable_config()->set_element_type(v1::FLOAT64);
  EXPECT_THAT(tables_.Create(request),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("wire_compression needs a float32 table; this one is float64")));
  request.mutable_config()->set_element_type(v1::FLOAT32);
  EXPECT_THAT(tables_.Create(request), IsOk());
}

}  // namespace
}  // namespace pserver
