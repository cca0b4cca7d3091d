#include "cc/metrics/metrics.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/metrics/text_format.h"
#include "cc/testing/run_program.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver::metrics {
namespace {

using ::testing::HasSubstr;

TEST(CounterTest, CountsEveryAddFromManyThreads) {
  Counter counter;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) counter.Add(i % 2 == 0 ? 1 : 2);
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(counter.value(), 4u * (5000 * 1 + 5000 * 2));
}

TEST(HistogramTest, BoundsAreInclusiveAndCountIsTheSumOfBuckets) {
  Histogram histogram({10, 20});
  for (uint64_t v : {0, 10, 11, 20, 21, 1000}) histogram.Observe(v);
  const Histogram::Snapshot s = histogram.Read();
  EXPECT_THAT(s.buckets, ::testing::ElementsAre(2, 2, 2));
  EXPECT_EQ(s.count, 6u);
  EXPECT_EQ(s.sum, 0u + 10 + 11 + 20 + 21 + 1000);
}

TEST(HistogramTest, LatencyBoundsAscend) {
  const std::vector<uint64_t> bounds = LatencyBoundsNanos();
  ASSERT_FALSE(bounds.empty());
  for (size_t i = 1; i < bounds.size(); ++i) EXPECT_LT(bounds[i - 1], bounds[i]);
  EXPECT_EQ(bounds.front(), 50000u);
  EXPECT_EQ(bounds.back(), 60000000000u);
}

TEST(TextFormatTest, WritesFamiliesAndEscapesLabelsAndHelp) {
  TextWriter out;
  out.Family("pserver_requests_total", "Requests \\ served,\nby method.", Type::kCounter);
  out.Sample("pserver_requests_total", {{"method", "Get\"Param\\\n"}, {"code", "OK"}},
             uint64_t{18446744073709551615u});
  out.Family("pserver_lag", "Lag.", Type::kGauge);
  out.Sample("pserver_lag", {}, int64_t{-3});
  out.Sample("pserver_lag", {{"a", ""}}, 0.25);
  EXPECT_EQ(out.Take(),
            "# HELP pserver_requests_total Requests \\\\ served,\\nby method.\n"
            "# TYPE pserver_requests_total counter\n"
            "pserver_requests_total{method=\"Get\\\"Param\\\\\\n\",code=\"OK\"} "
            "18446744073709551615\n"
            "# HELP pserver_lag Lag.\n"
            "# TYPE pserver_lag gauge\n"
            "pserver_lag -3\n"
            "pserver_lag{a=\"\"} 0.25\n");
}

TEST(TextFormatTest, LabelValuesThatAreNotUtf8BecomeReplacementCharacters) {
  TextWriter out;
  // Two stray bytes, then a valid two-byte character (é) that stays.
  out.Sample("x", {{"worker", std::string("a\xff\xfe\xc3\xa9" "b", 6)}}, uint64_t{1});
  EXPECT_EQ(out.Take(), "x{worker=\"a\xEF\xBF\xBD\xEF\xBF\xBD\xC3\xA9" "b\"} 1\n");
}

TEST(TextFormatTest, HistogramIsCumulativeWithInfAndScaledBounds) {
  Histogram histogram({1000000, 2500000});  // 1 ms, 2.5 ms in nanoseconds
  histogram.Observe(500000);
  histogram.Observe(2000000);
  histogram.Observe(3000000000);
  const Histogram::Snapshot s = histogram.Read();
  TextWriter out;
  out.Histogram("x_seconds", {{"method", "Push"}}, histogram.bounds(), s.buckets, s.sum, 1e9);
  EXPECT_EQ(out.Take(),
            "x_seconds_bucket{method=\"Push\",le=\"0.001\"} 1\n"
            "x_seconds_bucket{method=\"Push\",le=\"0.0025\"} 2\n"
            "x_seconds_bucket{method=\"Push\",le=\"+Inf\"} 3\n"
            "x_seconds_sum{method=\"Push\"} 3.0025\n"
            "x_seconds_count{method=\"Push\"} 3\n");
}

TEST(TextFormatTest, DoublesRoundTripAndSpecialValues) {
  EXPECT_EQ(FormatDouble(std::numeric_limits<double>::quiet_NaN()), "NaN");
  EXPECT_EQ(FormatDouble(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatDouble(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatDouble(1.5), "1.5");
  for (double v : {0.1, 1e-9, 123456789.123, 6.02e23}) {
    EXPECT_EQ(std::stod(FormatDouble(v)), v) << FormatDouble(v);
  }
}

TEST(TextFormatTest, ValidNames) {
  EXPECT_TRUE(IsValidName("pserver_requests_total"));
  EXPECT_TRUE(IsValidName("a:b_1"));
  EXPECT_FALSE(IsValidName("a:b", /*label=*/true));
  EXPECT_FALSE(IsValidName("1abc"));
  EXPECT_FALSE(IsValidName("a-b"));
  EXPECT_FALSE(IsValidName(""));
}

TEST(RegistryTest, RendersCollectorsInOrderAtEveryCall) {
  Registry registry;
  Counter counter;
  registry.Add([&](TextWriter& out) {
    out.Family("a_total", "A.", Type::kCounter);
    out.Sample("a_total", {}, counter.value());
  });
  registry.Add([](TextWriter& out) {
    out.Family("b", "B.", Type::kGauge);
    out.Sample("b", {}, 1.0);
  });
  counter.Add(7);
  const std::string page = registry.Render();
  EXPECT_THAT(page, HasSubstr("a_total 7\n"));
  EXPECT_LT(page.find("a_total 7"), page.find("\nb 1\n"));
  counter.Add();
  EXPECT_THAT(registry.Render(), HasSubstr("a_total 8\n"));
}

// Prometheus's own checker (promtool, from Debian's prometheus) parses the
// page and lints its names.
TEST(TextFormatTest, PromtoolAcceptsThePage) {
  absl::StatusOr<std::string> promtool = FindProgram("promtool");
  if (!promtool.ok()) GTEST_SKIP() << "promtool not installed (./setup.sh installs prometheus)";
  Histogram histogram(LatencyBoundsNanos());
  histogram.Observe(123456);
  const Histogram::Snapshot s = histogram.Read();
  TextWriter out;
  out.Family("pserver_request_duration_seconds", "Time to answer a request.", Type::kHistogram);
  out.Histogram("pserver_request_duration_seconds", {{"method", "Push"}}, histogram.bounds(),
                s.buckets, s.sum, 1e9);
  out.Family("pserver_requests_total", "Requests \"served\".", Type::kCounter);
  out.Sample("pserver_requests_total", {{"method", "a\"b\\c\nd"}}, uint64_t{3});
  out.Family("pserver_table_rows", "Rows.", Type::kGauge);
  out.Sample("pserver_table_rows", {{"table", "emb"}}, uint64_t{4});
  const std::string path = absl::StrCat(getenv("TEST_TMPDIR"), "/page.txt");
  FILE* f = fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  const std::string page = out.Take();
  fwrite(page.data(), 1, page.size(), f);
  fclose(f);
  EXPECT_OK(RunProgram("/bin/sh", {"-c", absl::StrCat(*promtool, " check metrics < ", path)},
                       absl::Now() + absl::Seconds(60)));
  // And it does find fault with a bad page, so the check above means something.
  f = fopen(path.c_str(), "w");
  fputs("# TYPE pserver_requests counter\npserver_requests 1\n", f);
  fclose(f);
  EXPECT_FALSE(RunProgram("/bin/sh", {"-c", absl::StrCat(*promtool, " check metrics < ", path)},
                          absl::Now() + absl::Seconds(60))
                   .ok());
}

}  // namespace
}  // namespace pserver::metrics
