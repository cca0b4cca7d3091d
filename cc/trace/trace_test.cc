#include "cc/trace/trace.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "cc/testing/status_matchers.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace trace {
namespace {

using ::testing::HasSubstr;
using ::pserver::testing::IsOk;
using ::pserver::testing::StatusIs;

std::string TempPath(const std::string& name) {
  return absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The file parsed as JSON (google.protobuf.Struct accepts any JSON object).
google::protobuf::Struct Parse(const std::string& json) {
  google::protobuf::Struct parsed;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &parsed);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << json;
  return parsed;
}

// The "X" events of a parsed trace.
std::vector<google::protobuf::Struct> Spans(const google::protobuf::Struct& trace) {
  std::vector<google::protobuf::Struct> out;
  for (const auto& event : trace.fields().at("traceEvents").list_value().values()) {
    if (event.struct_value().fields().at("ph").string_value() == "X") {
      out.push_back(event.struct_value());
    }
  }
  return out;
}

TEST(TraceTest, WritesParsableChromeTraceWithEventsInOrder) {
  RecorderOptions options;
  options.path = TempPath("basic.json");
  options.process_name = "worker \"0\"";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Recorder> recorder, Recorder::Open(options));
  const int64_t start = NowMicros();
  recorder->Complete("SendGrads", "call", start, start + 5, Recorder::ThreadTrack(),
                     Args().Add("call", 1).Add("param", "w\n").AddHex("client_id", ~0ull).json());
  recorder->Complete("Push", "request", start + 1, start + 4, 1000);
  recorder->NameTrack(1000, "server 0");
  ASSERT_THAT(recorder->Flush(), IsOk());

  const google::protobuf::Struct trace = Parse(ReadFile(options.path));
  const std::vector<google::protobuf::Struct> spans = Spans(trace);
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans[0].fields().at("name").string_value(), "SendGrads");
  EXPECT_EQ(spans[0].fields().at("ts").number_value(), start);
  EXPECT_EQ(spans[0].fields().at("dur").number_value(), 5);
  EXPECT_EQ(spans[0].fields().at("args").struct_value().fields().at("param").string_value(), "w\n");
  EXPECT_EQ(spans[0].fields().at("args").struct_value().fields().at("client_id").string_value(),
            "ffffffffffffffff");
  EXPECT_EQ(spans[1].fields().at("tid").number_value(), 1000);
  const auto& other = trace.fields().at("otherData").struct_value().fields();
  EXPECT_EQ(other.at("clock").string_value(), "CLOCK_MONOTONIC");
  EXPECT_LE(other.at("start_monotonic_us").number_value(), start);
  EXPECT_GT(other.at("start_unix_us").number_value(), 0);
  EXPECT_EQ(other.at("dropped_events").number_value(), 0);
  const std::string json = ReadFile(options.path);
  EXPECT_THAT(json, HasSubstr("\"thread_name\""));
  EXPECT_THAT(json, HasSubstr("worker \\\"0\\\""));
}

TEST(TraceTest, JsonStringsAreValidJsonForAnyBytes) {
  EXPECT_EQ(JsonString("plain"), "\"plain\"");
  EXPECT_EQ(JsonString("a\"b\\c\nd\x01"), "\"a\\\"b\\\\c\\nd\\u0001\"");
  EXPECT_EQ(JsonString("caf\xc3\xa9 \xe2\x82\xac"), "\"caf\xc3\xa9 \xe2\x82\xac\"");  // UTF-8 kept
  // Bytes that are not UTF-8 (a lone continuation, a cut sequence, an
  // overlong form, a surrogate) become U+FFFD.
  EXPECT_EQ(JsonString("\x80x\xc3"), "\"\\ufffdx\\ufffd\"");
  EXPECT_EQ(JsonString("\xc0\xaf\xed\xa0\x80"), "\"\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd\"");
  // Whatever the bytes, the result parses.
  std::string all;
  for (int c = 0; c < 256; ++c) all += static_cast<char>(c);
  Parse(absl::StrCat("{\"k\":", JsonString(all), "}"));
}

TEST(TraceTest, RingKeepsTheNewestMaxEvents) {
  RecorderOptions options;
  options.path = TempPath("ring.json");
  options.max_events = 3;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Recorder> recorder, Recorder::Open(options));
  for (int i = 0; i < 10; ++i) recorder->Complete(absl::StrCat("e", i), "t", i, i + 1, 1);
  EXPECT_EQ(recorder->recorded(), 10u);
  EXPECT_EQ(recorder->dropped(), 7u);
  ASSERT_THAT(recorder->Flush(), IsOk());
  const google::protobuf::Struct trace = Parse(ReadFile(options.path));
  const std::vector<google::protobuf::Struct> spans = Spans(trace);
  ASSERT_EQ(spans.size(), 3u);
  EXPECT_EQ(spans[0].fields().at("name").string_value(), "e7");
  EXPECT_EQ(spans[2].fields().at("name").string_value(), "e9");
  EXPECT_EQ(trace.fields().at("otherData").struct_value().fields().at("dropped_events")
                .number_value(),
            7);
}

TEST(TraceTest, ConcurrentRecordingStaysWithinTheCap) {
  RecorderOptions options;
  options.path = TempPath("threads.json");
  options.max_events = 100;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Recorder> recorder, Recorder::Open(options));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) {
        const int64_t now = NowMicros();
        recorder->Complete("e", "t", now, now, Recorder::ThreadTrack());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(recorder->recorded(), 4000u);
  ASSERT_THAT(recorder->Flush(), IsOk());
  EXPECT_EQ(Spans(Parse(ReadFile(options.path))).size(), 100u);
}

TEST(TraceTest, DestructorWritesTheFile) {
  RecorderOptions options;
  options.path = TempPath("at_exit.json");
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Recorder> recorder, Recorder::Open(options));
    EXPECT_EQ(ReadFile(options.path), "");  // created empty at Open
    recorder->Complete("last", "t", 1, 2, 1);
  }
  ASSERT_EQ(Spans(Parse(ReadFile(options.path))).size(), 1u);
}

TEST(TraceTest, BadOptionsAreRefusedWithTheReason) {
  RecorderOptions options;
  EXPECT_THAT(Recorder::Open(options), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no file")));
  options.path = TempPath("zero.json");
  options.max_events = 0;
  EXPECT_THAT(Recorder::Open(options).status().message(), HasSubstr("max_events"));
  options.max_events = 1;
  options.path = "/nonexistent-dir/x.json";
  EXPECT_THAT(Recorder::Open(options).status().message(), HasSubstr("/nonexistent-dir/x.json"));
}

TEST(TraceTest, EnvironmentNamesTheFileAndItsCap) {
  unsetenv("PSERVER_TEST_TRACE");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Recorder> none,
                       OpenFromPathOrEnvironment("", "PSERVER_TEST_TRACE", "w"));
  EXPECT_EQ(none, nullptr);
  const std::string path = TempPath("env.json");
  setenv("PSERVER_TEST_TRACE", path.c_str(), 1);
  setenv("PSERVER_TEST_TRACE_MAX_EVENTS", "5", 1);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Recorder> named,
                       OpenFromPathOrEnvironment("", "PSERVER_TEST_TRACE", "w"));
  ASSERT_NE(named, nullptr);
  EXPECT_EQ(named->path(), path);
  EXPECT_EQ(named->max_events(), 5u);
  setenv("PSERVER_TEST_TRACE_MAX_EVENTS", "lots", 1);
  EXPECT_THAT(OpenFromPathOrEnvironment("", "PSERVER_TEST_TRACE", "w").status().message(),
              HasSubstr("PSERVER_TEST_TRACE_MAX_EVENTS='lots'"));
  // An explicit path wins over the environment.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Recorder> given,
                       OpenFromPathOrEnvironment(TempPath("given.json"), "PSERVER_TEST_TRACE", "w"));
  EXPECT_EQ(given->path(), TempPath("given.json"));
  unsetenv("PSERVER_TEST_TRACE");
  unsetenv("PSERVER_TEST_TRACE_MAX_EVENTS");
}

TEST(TraceTest, WallClockMapsOntoTheMonotonicTimeLine) {
  RecorderOptions options;
  options.path = TempPath("clock.json");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Recorder> recorder, Recorder::Open(options));
  const absl::Time wall = absl::Now();
  const int64_t mapped = recorder->MonotonicMicrosOf(wall);
  // Ordering only: one second later on the wall is one second later here.
  EXPECT_EQ(recorder->MonotonicMicrosOf(wall + absl::Seconds(1)), mapped + 1000000);
}

TEST(TraceTest, LanesKeepOverlappingSpansApart) {
  RecorderOptions options;
  options.path = TempPath("lanes.json");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Recorder> recorder, Recorder::Open(options));
  Lanes lanes(100, "-> server 0", /*max_lanes=*/2);
  EXPECT_EQ(lanes.Place(*recorder, 10, 20), 100u);
  EXPECT_EQ(lanes.Place(*recorder, 15, 30), 101u);  // overlaps the first: a second lane
  EXPECT_EQ(lanes.Place(*recorder, 20, 25), 100u);  // the first lane is free from 20
  // Past max_lanes: the lane that frees first (100 at 25, 101 at 30).
  EXPECT_EQ(lanes.Place(*recorder, 21, 40), 100u);
  ASSERT_OK(recorder->Flush());
  const std::string json = ReadFile(options.path);
  EXPECT_THAT(json, HasSubstr("\"-> server 0\""));
  EXPECT_THAT(json, HasSubstr("\"-> server 0 #2\""));
}

TEST(TraceTest, SpanRecordsOnlyWithARecorder) {
  { Span off(nullptr, "nothing", "t"); EXPECT_FALSE(off.active()); }
  RecorderOptions options;
  options.path = TempPath("span.json");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Recorder> recorder, Recorder::Open(options));
  const int64_t before = NowMicros();
  {
    Span outer(recorder.get(), "outer", "t");
    Span inner(recorder.get(), "inner", "t");
    inner.set_args(Args().Add("n", 3).json());
  }
  ASSERT_OK(recorder->Flush());
  const std::vector<google::protobuf::Struct> spans = Spans(Parse(ReadFile(options.path)));
  ASSERT_EQ(spans.size(), 2u);  // inner ends first
  const auto& inner = spans[0].fields();
  const auto& outer = spans[1].fields();
  EXPECT_EQ(inner.at("name").string_value(), "inner");
  EXPECT_EQ(inner.at("args").struct_value().fields().at("n").number_value(), 3);
  EXPECT_GE(outer.at("ts").number_value(), before);
  EXPECT_LE(outer.at("ts").number_value(), inner.at("ts").number_value());
  EXPECT_GE(outer.at("ts").number_value() + outer.at("dur").number_value(),
            inner.at("ts").number_value() + inner.at("dur").number_value());
  EXPECT_EQ(outer.at("tid").number_value(), inner.at("tid").number_value());
}

}  // namespace
}  // namespace trace
}  // namespace pserver
