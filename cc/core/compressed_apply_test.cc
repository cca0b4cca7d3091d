// The store applies gradients that arrived compressed on the wire (float16,
// bfloat16, top-k; cc/core/compression.h) as float32 SGD would apply the same
// values, refuses bad ones whole, and reads float32 blocks in a half type.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cc/core/compression.h"
#include "cc/core/parameter_store.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pserver/v1/config.pb.h"
#include "pserver/v1/service.pb.h"
#include "pserver/v1/types.pb.h"

namespace pserver {
namespace {

using ::pserver::testing::IsOk;
using ::pserver::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

std::string Bytes(const void* data, size_t n) {
  return std::string(static_cast<const char*>(data), n);
}

std::vector<float> Floats(const std::string& bytes) {
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

// Values exact in float16 and bfloat16 (k / 64, |k| <= 128).
std::vector<float> Gradient(int seed, size_t n) {
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) g[i] = static_cast<float>((static_cast<int>(i) * 37 + seed * 11) % 257 - 128) / 64.0f;
  return g;
}

class CompressedApplyTest : public ::testing::Test {
 protected:
  static constexpr size_t kN = 40;

  // Parameters "plain" (float32 gradients) and "wire", same start and
  // config (SGD with momentum, so a wrong zero would show).
  void SetUp() override {
    v1::ParameterConfig config;
    config.mutable_optimizer()->mutable_sgd()->set_momentum(0.5);
    config.mutable_learning_rate()->set_learning_rate(0.25);
    for (const char* name : {"plain", "wire"}) {
      ASSERT_THAT(store_.Init(Param(name, std::vector<float>(kN, 1.0f)), config), IsOk());
    }
    v1::ParameterConfig ints;
    ints.mutable_optimizer()->mutable_add();
    v1::Parameter counts;
    counts.set_name("counts");
    counts.set_element_type(v1::INT32);
    counts.add_shape(2);
    counts.set_content(std::string(8, '\0'));
    ASSERT_THAT(store_.Init(counts, ints), IsOk());
    store_.FinishInit();
  }

  static v1::Parameter Param(const std::string& name, const std::vector<float>& values) {
    v1::Parameter p;
    p.set_name(name);
    p.set_element_type(v1::FLOAT32);
    p.add_shape(static_cast<int64_t>(values.size()));
    p.set_content(Bytes(values.data(), values.size() * 4));
    return p;
  }

  static v1::Gradient Encoded(const std::string& name, ElementType type,
                              const std::vector<float>& values,
                              const std::vector<uint32_t>& indices = {}) {
    v1::Gradient g;
    g.set_name(name);
    g.set_element_type(type);
    std::string content(values.size() * ElementSize(type), '\0');
    EncodeFloats(type, values.data(), values.size(), content.data());
    g.set_content(content);
    g.set_indices(Bytes(indices.data(), indices.size() * 4));
    return g;
  }

  absl::Status Apply(const v1::Gradient& g) { return store_.ApplyGradients({&g}); }

  std::vector<float> Values(const std::string& name) {
    v1::ParamRef ref;
    ref.set_name(name);
    v1::Parameter out;
    EXPECT_THAT(store_.Get(ref, &out), IsOk());
    return Floats(out.content());
  }

  ParameterStore store_;
};

TEST_F(CompressedApplyTest, HalfTypesApplyAsFloat32) {
  for (ElementType type : {v1::FLOAT16, v1::BFLOAT16, v1::FLOAT32}) {
    for (int step = 0; step < 3; ++step) {
      const std::vector<float> g = Gradient(step, kN);
      ASSERT_THAT(Apply(Encoded("plain", v1::FLOAT32, g)), IsOk());
      ASSERT_THAT(Apply(Encoded("wire", type, g)), IsOk());
    }
    EXPECT_THAT(Values("wire"), ElementsAreArray(Values("plain"))) << ElementTypeName(type);
  }
}

TEST_F(CompressedApplyTest, TopKAppliesTheDenseGradientZeroElsewhere) {
  for (ElementType type : {v1::FLOAT32, v1::FLOAT16}) {
    for (int step = 0; step < 3; ++step) {
      std::vector<float> dense(kN, 0.0f);
      dense[3] = 1.5f;
      dense[17] = -0.25f + static_cast<float>(step);
      dense[39] = 2.0f;
      ASSERT_THAT(Apply(Encoded("plain", v1::FLOAT32, dense)), IsOk());
      // Index 3 sent as two halves: repeats are summed.
      ASSERT_THAT(Apply(Encoded("wire", type, {0.75f, dense[17], 2.0f, 0.75f}, {3, 17, 39, 3})),
                  IsOk());
    }
    EXPECT_THAT(Values("wire"), ElementsAreArray(Values("plain"))) << ElementTypeName(type);
  }
}

TEST_F(CompressedApplyTest, BadInputIsRefusedWholeAndNamed) {
  const std::vector<float> before = Values("wire");
  const v1::Gradient good = Encoded("plain", v1::FLOAT16, Gradient(1, kN));
  auto refused = [&](const v1::Gradient& bad, const std::string& message) {
    // A good gradient in the same request is not applied either.
    EXPECT_THAT(store_.ApplyGradients({&good, &bad}),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(message)));
  };
  refused(Encoded("wire", v1::FLOAT16, {1.0f, 2.0f}, {0, 40}),
          "gradient for parameter 'wire': top-k index 40 (entry 1) is out of range");
  refused(Encoded("wire", v1::FLOAT16, {1.0f}, {0, 1}), "one per top-k index");
  refused(Encoded("wire", v1::FLOAT16, std::vector<float>(kN - 1)), "78 bytes received, 80");
  v1::Gradient unknown = Encoded("wire", v1::FLOAT32, Gradient(0, kN));
  unknown.set_element_type(static_cast<ElementType>(42));
  refused(unknown, "element type unknown(42)");
  v1::Gradient odd = Encoded("wire", v1::FLOAT32, {1.0f}, {0});
  odd.mutable_indices()->push_back('x');
  refused(odd, "not a multiple of 4");
  v1::Gradient ints = Encoded("counts", v1::FLOAT32, {1.0f}, {0});
  ints.set_element_type(v1::INT32);
  ints.set_content(std::string(4, '\0'));
  refused(ints, "top-k indices (compression on the wire) need a float32 parameter; this one is "
                "int32");
  refused(Encoded("wire", v1::FLOAT16, {1.0f, NAN}, {5, 9}),
          "gradient for parameter 'wire': element 9 is NaN");
  EXPECT_THAT(Values("wire"), ElementsAreArray(before));
  EXPECT_THAT(Values("plain"), ElementsAreArray(std::vector<float>(kN, 1.0f)));
}

TEST_F(CompressedApplyTest, ReadsInAHalfType) {
  const std::vector<float> g = Gradient(2, kN);
  ASSERT_THAT(Apply(Encoded("wire", v1::FLOAT32, g)), IsOk());
  const std::vector<float> want = Values("wire");
  for (ElementType type : {v1::FLOAT16, v1::BFLOAT16}) {
    v1::ParamRef ref;
    ref.set_name("wire");
    ref.set_wire_type(type);
    v1::Parameter out;
    ASSERT_THAT(store_.Get(ref, &out), IsOk());
    EXPECT_EQ(out.element_type(), v1::FLOAT32);
    EXPECT_EQ(out.content_type(), type);
    ASSERT_EQ(out.content().size(), kN * 2);
    std::vector<float> got(kN);
    DecodeFloats(type, out.content().data(), kN, got.data());
    for (size_t i = 0; i < kN; ++i) {
      EXPECT_NEAR(got[i], want[i], std::fabs(want[i]) * (type == v1::FLOAT16 ? 1e-3 : 8e-3));
    }
  }
  v1::ParamRef ints;
  ints.set_name("counts");
  ints.set_wire_type(v1::FLOAT16);
  v1::Parameter out;
  EXPECT_THAT(store_.Get(ints, &out),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("read of parameter 'counts': wire_type float16 is not possible "
                                 "for a int32 parameter")));
}

TEST(CompressedConfigTest, InitChecksTheConfig) {
  ParameterStore store;
  v1::Parameter p;
  p.set_name("d");
  p.set_element_type(v1::FLOAT64);
  p.add_shape(1);
  p.set_content(std::string(8, '\0'));
  v1::ParameterConfig config;
  config.mutable_wire_compression()->set_topk_fraction(0.1);
  EXPECT_THAT(store.Init(p, config),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("parameter 'd': wire_compression needs a float32 parameter; "
                                 "this one is float64")));
  config.mutable_wire_compression()->set_topk_fraction(-1);
  p.set_element_type(v1::FLOAT32);
  p.set_content(std::string(4, '\0'));
  EXPECT_THAT(store.Init(p, config),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("wire_compression.topk_fraction must be in [0, 1]")));
  config.mutable_wire_compression()->set_topk_fraction(0.5);
  config.mutable_wire_compression()->set_value_type(v1::WireCompression::BFLOAT16);
  ASSERT_THAT(store.Init(p, config), IsOk());
  store.FinishInit();
  v1::ParamRef ref;
  ref.set_name("d");
  v1::Parameter out;
  ASSERT_THAT(store.Get(ref, &out), IsOk());
  EXPECT_EQ(out.wire_compression().value_type(), v1::WireCompression::BFLOAT16);
  EXPECT_EQ(out.wire_compression().topk_fraction(), 0.5);
}

}  // namespace
}  // namespace pserver
