#include "cc/core/config_fields.h"

#include <cmath>
#include <limits>

#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pserver/v1/config.pb.h"
#include "pserver/v1/table.pb.h"

namespace pserver {
namespace {

using ::pserver::testing::IsOk;
using ::pserver::testing::StatusIs;
using ::testing::HasSubstr;

TEST(ChooseOneofTest, ChoosesAMemberByNameClearingItsSettings) {
  v1::ParameterConfig config;
  config.mutable_optimizer()->mutable_adam()->set_beta1(0.5);
  ASSERT_THAT(ChooseOneof(config.mutable_optimizer(), "kind", "adam", "optimizer"), IsOk());
  EXPECT_TRUE(config.optimizer().has_adam());
  EXPECT_FALSE(config.optimizer().adam().has_beta1());
}

TEST(ChooseOneofTest, UnknownNameListsTheMembersInOrder) {
  v1::ParameterConfig config;
  EXPECT_THAT(ChooseOneof(config.mutable_optimizer(), "kind", "lion", "optimizer"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "unknown optimizer 'lion'; want one of sgd, adagrad, adadelta, rmsprop, "
                       "adam, adamw, add"));
  v1::TableConfig table;
  EXPECT_THAT(ChooseOneof(table.mutable_initializer(), "kind", "ones", "initializer"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "unknown initializer 'ones'; want one of zeros, uniform, normal"));
}

TEST(SetParameterSettingTest, FindsTheKeyInOptimizerScheduleDecayAndClipping) {
  v1::ParameterConfig config;
  config.mutable_optimizer()->mutable_adam();
  config.mutable_learning_rate()->mutable_step();
  ASSERT_THAT(SetParameterSetting(&config, "beta1", 0.8), IsOk());
  ASSERT_THAT(SetParameterSetting(&config, "lr", 0.1), IsOk());
  ASSERT_THAT(SetParameterSetting(&config, "step_size", 100), IsOk());
  ASSERT_THAT(SetParameterSetting(&config, "clip_norm", 2), IsOk());
  EXPECT_EQ(config.optimizer().adam().beta1(), 0.8);
  EXPECT_EQ(config.learning_rate().learning_rate(), 0.1);
  EXPECT_EQ(config.learning_rate().step().step_size(), 100u);
  EXPECT_EQ(config.clipping().clip_norm(), 2);
}

TEST(SetParameterSettingTest, WireCompressionSettingsAndText) {
  v1::ParameterConfig config;
  ASSERT_THAT(SetParameterSetting(&config, "lr", 0.5), IsOk());
  EXPECT_FALSE(config.has_wire_compression());  // no other setting makes one
  ASSERT_THAT(SetParameterSetting(&config, "topk_fraction", 0.01), IsOk());
  ASSERT_THAT(SetParameterSetting(&config, "topk_count", 100), IsOk());
  EXPECT_EQ(config.wire_compression().topk_fraction(), 0.01);
  EXPECT_EQ(config.wire_compression().topk_count(), 100u);
  v1::ParameterConfig parsed;
  ASSERT_THAT(ParseConfigText("wire_compression { value_type: BFLOAT16 topk_fraction: 0.1 }",
                              &parsed),
              IsOk());
  EXPECT_EQ(parsed.wire_compression().value_type(), v1::WireCompression::BFLOAT16);
  EXPECT_EQ(ConfigText(parsed), "wire_compression { value_type: BFLOAT16 topk_fraction: 0.1 }");
}

TEST(SetParameterSettingTest, NoOptimizerMeansSgd) {
  v1::ParameterConfig config;
  ASSERT_THAT(SetParameterSetting(&config, "momentum", 0.9), IsOk());
  EXPECT_EQ(config.optimizer().sgd().momentum(), 0.9);
}

TEST(SetParameterSettingTest, BadValuesNameTheKeyAndChangeNothing) {
  v1::ParameterConfig config;
  config.mutable_optimizer()->mutable_sgd()->set_momentum(0.5);
  const v1::ParameterConfig before = config;
  EXPECT_THAT(SetParameterSetting(&config, "nesterov", 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "config setting 'nesterov' is a boolean (0 or 1), got 2"));
  EXPECT_THAT(SetParameterSetting(&config, "warmup_steps", 1.5),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("config setting 'warmup_steps' is a count")));
  EXPECT_THAT(SetParameterSetting(&config, "momentum", std::nan("")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("want a finite number")));
  EXPECT_EQ(config.SerializeAsString(), before.SerializeAsString());
}

TEST(SetParameterSettingTest, UnknownKeyListsTheValidSettings) {
  v1::ParameterConfig config;
  EXPECT_THAT(SetParameterSetting(&config, "beta1", 0.5),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "unknown config setting 'beta1' for optimizer SgdConfig; valid settings: "
                       "momentum, nesterov, weight_decay, learning_rate, warmup_steps, "
                       "warmup_start_factor, clip_norm, clip_value, lr"));
  EXPECT_FALSE(config.has_optimizer());
}

TEST(SetTableSettingTest, FindsTheKeyInEveryPartOfATableConfig) {
  v1::TableConfig config;
  config.mutable_initializer()->mutable_uniform();
  ASSERT_THAT(SetTableSetting(&config, "lr", 0.5), IsOk());
  ASSERT_THAT(SetTableSetting(&config, "high", 0.25), IsOk());
  ASSERT_THAT(SetTableSetting(&config, "seed", 7), IsOk());
  ASSERT_THAT(SetTableSetting(&config, "admission_count", 3), IsOk());
  ASSERT_THAT(SetTableSetting(&config, "staleness", 2), IsOk());
  ASSERT_THAT(SetTableSetting(&config, "chunk_size", 16), IsOk());
  EXPECT_EQ(config.optimizer().sgd().learning_rate(), 0.5);
  EXPECT_EQ(config.initializer().uniform().high(), 0.25);
  EXPECT_EQ(config.initializer().seed(), 7u);
  EXPECT_EQ(config.eviction().admission_count(), 3u);
  EXPECT_EQ(config.consistency().staleness(), 2u);
  EXPECT_EQ(config.chunk_size(), 16u);
}

TEST(SetTableSettingTest, CountsAndEnumsAreCheckedAndChangeNothing) {
  v1::TableConfig config;
  config.set_dim(4);
  const v1::TableConfig before = config;
  EXPECT_THAT(SetTableSetting(&config, "dim", 4294967296.0),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "table setting 'dim' is a count (a whole number in [0, 2^32)), got "
                       "4.29497e+09"));
  EXPECT_THAT(SetTableSetting(&config, "model", 1),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("unknown table setting 'model' for optimizer Sgd")));
  EXPECT_EQ(config.SerializeAsString(), before.SerializeAsString());
}

TEST(ConfigTextTest, RoundTripsOneLine) {
  v1::ParameterConfig config;
  ASSERT_THAT(ParseConfigText("optimizer { adam { beta1: 0.5 } }", &config), IsOk());
  EXPECT_EQ(ConfigText(config), "optimizer { adam { beta1: 0.5 } }");
}

TEST(ConfigTextTest, BadTextNamesTheTypeAndPlaceAndChangesNothing) {
  v1::TableConfig config;
  config.set_dim(3);
  EXPECT_THAT(ParseConfigText("dim: 2\nbogus: 1", &config),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not a pserver.v1.TableConfig in text format: 2:")));
  EXPECT_EQ(config.dim(), 3u);
}

}  // namespace
}  // namespace pserver
