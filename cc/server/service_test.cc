// End-to-end tests of ParameterServerService: a real Server on 127.0.0.1 with
// a port the system picks, driven through a raw gRPC stub so every status
// code and message is exactly what a client in any language would see.
#include "cc/server/service.h"

#include <dirent.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cc/client/client.h"
#include "cc/rpc/grpc_status.h"
#include "cc/server/server.h"
#include "absl/synchronization/notification.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "pserver/v1/service.grpc.pb.h"

namespace pserver {
namespace {

using ::pserver::testing::IsOk;
using ::pserver::testing::StatusCodeIs;
using ::pserver::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kAlreadyInitialized[] = "pserver already initialized";
constexpr char kNotInitialized[] = "pserver not fully initialized";

// Every call's deadline: generous for a loaded test machine, bounded.
constexpr std::chrono::seconds kCallTimeout(10);

template <typename T>
std::string Bytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

template <typename T>
std::vector<T> Values(const std::string& bytes) {
  std::vector<T> out(bytes.size() / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

template <typename T>
v1::Parameter MakeParam(const std::string& name, v1::ElementType type, std::vector<int64_t> shape,
                        const std::vector<T>& values) {
  v1::Parameter param;
  param.set_name(name);
  param.set_element_type(type);
  for (int64_t d : shape) param.add_shape(d);
  param.set_content(Bytes(values));
  return param;
}

v1::Parameter Float32Param(const std::string& name, const std::vector<float>& values) {
  return MakeParam(name, v1::FLOAT32, {static_cast<int64_t>(values.size())}, values);
}

v1::Parameter Float64Param(const std::string& name, const std::vector<double>& values) {
  return MakeParam(name, v1::FLOAT64, {static_cast<int64_t>(values.size())}, values);
}

template <typename T>
v1::Gradient MakeGrad(const std::string& name, v1::ElementType type, const std::vector<T>& values) {
  v1::Gradient grad;
  grad.set_name(name);
  grad.set_element_type(type);
  grad.set_content(Bytes(values));
  return grad;
}

v1::Gradient Float32Grad(const std::string& name, const std::vector<float>& values) {
  return MakeGrad(name, v1::FLOAT32, values);
}

v1::Gradient Float64Grad(const std::string& name, const std::vector<double>& values) {
  return MakeGrad(name, v1::FLOAT64, values);
}

// Plain SGD with a constant learning rate.
v1::ParameterConfig Sgd(double learning_rate) {
  v1::ParameterConfig config;
  config.mutable_optimizer()->mutable_sgd();
  config.mutable_learning_rate()->set_learning_rate(learning_rate);
  return config;
}

class ServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(server_, Server::Start(ServerOptions{}));
    channel_ = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
    stub_ = v1::ParameterServer::NewStub(channel_);
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  static void SetDeadline(grpc::ClientContext* context) {
    context->set_deadline(std::chrono::system_clock::now() + kCallTimeout);
  }

  absl::Status InitParam(v1::Parameter param, const v1::ParameterConfig& config = {}) {
    v1::InitParamRequest request;
    *request.mutable_parameter() = std::move(param);
    *request.mutable_config() = config;
    v1::InitParamResponse response;
    grpc::ClientContext context;
    SetDeadline(&context);
    return FromGrpcStatus(stub_->InitParam(&context, request, &response));
  }

  absl::Status FinishInitParams() {
    v1::FinishInitParamsResponse response;
    grpc::ClientContext context;
    SetDeadline(&context);
    return FromGrpcStatus(
        stub_->FinishInitParams(&context, v1::FinishInitParamsRequest(), &response));
  }

  absl::StatusOr<v1::Parameter> GetParam(const std::string& name) {
    v1::GetParamRequest request;
    request.mutable_param()->set_name(name);
    return GetParam(request);
  }

  absl::StatusOr<v1::Parameter> GetParam(const v1::GetParamRequest& request) {
    v1::GetParamResponse response;
    grpc::ClientContext context;
    SetDeadline(&context);
    absl::Status status = FromGrpcStatus(stub_->GetParam(&context, request, &response));
    if (!status.ok()) return status;
    return response.parameter();
  }

  // The parameters (in request order), or the call's error; on an error,
  // `*returned` (if given) gets how many parameters came back anyway.
  absl::StatusOr<std::vector<v1::Parameter>> GetParams(const std::vector<std::string>& names,
                                                       int* returned = nullptr) {
    v1::GetParamsRequest request;
    for (const std::string& name : names) request.add_params()->set_name(name);
    v1::GetParamsResponse response;
    grpc::ClientContext context;
    SetDeadline(&context);
    absl::Status status = FromGrpcStatus(stub_->GetParams(&context, request, &response));
    if (returned != nullptr) *returned = response.parameters_size();
    if (!status.ok()) return status;
    return std::vector<v1::Parameter>(response.parameters().begin(), response.parameters().end());
  }

  absl::Status SendGrad(v1::Gradient grad) {
    v1::SendGradRequest request;
    *request.mutable_gradient() = std::move(grad);
    v1::SendGradResponse response;
    grpc::ClientContext context;
    SetDeadline(&context);
    return FromGrpcStatus(stub_->SendGrad(&context, request, &response));
  }

  absl::Status SendGrads(std::vector<v1::Gradient> grads) {
    v1::SendGradsRequest request;
    for (v1::Gradient& grad : grads) *request.add_gradients() = std::move(grad);
    v1::SendGradsResponse response;
    grpc::ClientContext context;
    SetDeadline(&context);
    return FromGrpcStatus(stub_->SendGrads(&context, request, &response));
  }

  absl::StatusOr<v1::ServerStats> GetStats() { return GetStatsFrom(stub_.get()); }

  static absl::StatusOr<v1::ServerStats> GetStatsFrom(v1::ParameterServer::Stub* stub) {
    v1::GetStatsResponse response;
    grpc::ClientContext context;
    SetDeadline(&context);
    absl::Status status =
        FromGrpcStatus(stub->GetStats(&context, v1::GetStatsRequest(), &response));
    if (!status.ok()) return status;
    return response.stats();
  }

  // The float32 values of `name`, read through GetParam.
  std::vector<float> Float32Values(const std::string& name) {
    absl::StatusOr<v1::Parameter> param = GetParam(name);
    EXPECT_THAT(param, IsOk());
    if (!param.ok()) return {};
    EXPECT_EQ(param->element_type(), v1::FLOAT32);
    return Values<float>(param->content());
  }

  std::vector<double> Float64Values(const std::string& name) {
    absl::StatusOr<v1::Parameter> param = GetParam(name);
    EXPECT_THAT(param, IsOk());
    if (!param.ok()) return {};
    EXPECT_EQ(param->element_type(), v1::FLOAT64);
    return Values<double>(param->content());
  }

  std::unique_ptr<Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::ParameterServer::Stub> stub_;
};

// ---- lifecycle --------------------------------------------------------------

// The generic control path: bytes that are not the method's request message
// are INVALID_ARGUMENT naming the message, counted as rejected, and change
// nothing; a method the service does not have is UNIMPLEMENTED.
TEST_F(ServiceTest, MalformedControlRequestIsRefusedAndCounted) {
  ASSERT_OK(InitParam(Float32Param("w", {1, 2})));
  ASSERT_OK(FinishInitParams());
  grpc::GenericStub generic(channel_);
  auto raw_call = [&](const std::string& method, const std::string& bytes) {
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request(&slice, 1);
    grpc::ByteBuffer response;
    grpc::ClientContext context;
    SetDeadline(&context);
    absl::Notification done;
    grpc::Status status;
    generic.UnaryCall(&context, method, grpc::StubOptions(), &request, &response,
                      [&](grpc::Status s) {
                        status = std::move(s);
                        done.Notify();
                      });
    done.WaitForNotification();
    return status;
  };
  // Field 1 (table, a string) with a length running past the end.
  const grpc::Status malformed =
      raw_call("/pserver.v1.ParameterServer/Clock", std::string("\x0a\x7f\x01", 3));
  EXPECT_EQ(malformed.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(malformed.error_message(), HasSubstr("malformed ClockRequest"));
  const grpc::Status unknown = raw_call("/pserver.v1.ParameterServer/NoSuchMethod", "");
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::UNIMPLEMENTED);

  ASSERT_OK_AND_ASSIGN(v1::ServerStats stats, GetStats());
  EXPECT_EQ(stats.requests_rejected(), 1u);
  EXPECT_THAT(Float32Values("w"), ElementsAre(1, 2));
}

TEST_F(ServiceTest, ServerListensOnLoopbackWithAPickedPort) {
  EXPECT_GT(server_->port(), 0);
  EXPECT_EQ(server_->address(), "127.0.0.1:" + std::to_string(server_->port()));
}

TEST_F(ServiceTest, FirstInitWinsAndSecondIsAlreadyExists) {
  ASSERT_OK(InitParam(Float32Param("w", {1, 2, 3})));

  // Same name, different values and even a different type: refused whole.
  EXPECT_THAT(InitParam(Float32Param("w", {9, 9, 9})),
              StatusIs(absl::StatusCode::kAlreadyExists,
                       AllOf(StartsWith(kAlreadyInitialized), HasSubstr("'w'"))));
  EXPECT_THAT(InitParam(Float64Param("w", {7})),
              StatusIs(absl::StatusCode::kAlreadyExists, StartsWith(kAlreadyInitialized)));

  ASSERT_OK(FinishInitParams());
  EXPECT_THAT(Float32Values("w"), ElementsAre(1.0f, 2.0f, 3.0f));
}

TEST_F(ServiceTest, AlreadyExistsIsTheRawGrpcCode) {
  ASSERT_OK(InitParam(Float32Param("w", {1})));
  v1::InitParamRequest request;
  *request.mutable_parameter() = Float32Param("w", {2});
  v1::InitParamResponse response;
  grpc::ClientContext context;
  SetDeadline(&context);
  grpc::Status status = stub_->InitParam(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_THAT(status.error_message(), StartsWith(kAlreadyInitialized));
}

TEST_F(ServiceTest, InitAfterFinishIsAlreadyExists) {
  ASSERT_OK(InitParam(Float32Param("early", {1})));
  ASSERT_OK(FinishInitParams());
  EXPECT_THAT(InitParam(Float32Param("late", {1, 2})),
              StatusIs(absl::StatusCode::kAlreadyExists,
                       AllOf(StartsWith(kAlreadyInitialized), HasSubstr("'late'"))));
  // Also for a name that is already there.
  EXPECT_THAT(InitParam(Float32Param("early", {5})),
              StatusIs(absl::StatusCode::kAlreadyExists, StartsWith(kAlreadyInitialized)));
  EXPECT_THAT(GetParam("late"), StatusCodeIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(Float32Values("early"), ElementsAre(1.0f));
}

TEST_F(ServiceTest, FinishInitParamsIsIdempotent) {
  ASSERT_OK(InitParam(Float32Param("w", {4})));
  ASSERT_OK(FinishInitParams());
  ASSERT_OK(FinishInitParams());
  EXPECT_THAT(Float32Values("w"), ElementsAre(4.0f));
}

TEST_F(ServiceTest, ReadsAndWritesBeforeFinishAreFailedPrecondition) {
  ASSERT_OK(InitParam(Float32Param("w", {1, 2}), Sgd(1)));

  EXPECT_THAT(GetParam("w"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr(kNotInitialized)));
  EXPECT_THAT(GetParams({"w"}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr(kNotInitialized)));
  EXPECT_THAT(SendGrad(Float32Grad("w", {1, 1})),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr(kNotInitialized)));
  EXPECT_THAT(SendGrads({Float32Grad("w", {1, 1})}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr(kNotInitialized)));
  // Unknown names too: the lifecycle is checked first.
  EXPECT_THAT(GetParam("nope"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr(kNotInitialized)));

  // None of the refused gradients was applied.
  ASSERT_OK(FinishInitParams());
  EXPECT_THAT(Float32Values("w"), ElementsAre(1.0f, 2.0f));
}

// ---- unknown names -----------------------------------------------------------

TEST_F(ServiceTest, UnknownNameIsNotFoundNamingIt) {
  ASSERT_OK(InitParam(Float32Param("w", {1})));
  ASSERT_OK(FinishInitParams());

  EXPECT_THAT(GetParam("missing_param"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("'missing_param'")));
  EXPECT_THAT(GetParams({"missing_param"}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("'missing_param'")));
  EXPECT_THAT(SendGrad(Float32Grad("missing_grad", {1})),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("'missing_grad'")));
  EXPECT_THAT(SendGrads({Float32Grad("missing_grads", {1})}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("'missing_grads'")));
}

TEST_F(ServiceTest, GetParamsWithOneUnknownNameFailsWhole) {
  ASSERT_OK(InitParam(Float32Param("a", {1})));
  ASSERT_OK(InitParam(Float32Param("b", {2})));
  ASSERT_OK(FinishInitParams());

  int returned = -1;
  EXPECT_THAT(GetParams({"a", "ghost", "b"}, &returned),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("'ghost'")));
  EXPECT_EQ(returned, 0);

  // The same batch without the unknown name works, in request order.
  ASSERT_OK_AND_ASSIGN(std::vector<v1::Parameter> params, GetParams({"b", "a"}));
  ASSERT_EQ(params.size(), 2u);
  EXPECT_EQ(params[0].name(), "b");
  EXPECT_THAT(Values<float>(params[0].content()), ElementsAre(2.0f));
  EXPECT_EQ(params[1].name(), "a");
  EXPECT_THAT(Values<float>(params[1].content()), ElementsAre(1.0f));
}

// ---- bad gradients -----------------------------------------------------------

TEST_F(ServiceTest, GradientOfWrongElementTypeIsInvalidArgument) {
  ASSERT_OK(InitParam(Float32Param("weights", {1, 2, 3}), Sgd(1)));
  ASSERT_OK(FinishInitParams());

  // 3 int32 values have the expected 12 bytes, so only the type is wrong; the
  // type is checked before the size, so float64 is reported as a type error.
  EXPECT_THAT(SendGrad(MakeGrad<int32_t>("weights", v1::INT32, {1, 1, 1})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("'weights'"), HasSubstr("float32"), HasSubstr("int32"))));
  EXPECT_THAT(SendGrad(Float64Grad("weights", {1, 1, 1})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("'weights'"), HasSubstr("float32"), HasSubstr("float64"))));
  EXPECT_THAT(Float32Values("weights"), ElementsAre(1.0f, 2.0f, 3.0f));
}

TEST_F(ServiceTest, GradientOfWrongSizeIsInvalidArgument) {
  // 7 float64 values: 56 bytes expected; 5 values (40 bytes) sent.
  ASSERT_OK(InitParam(Float64Param("bias", {1, 2, 3, 4, 5, 6, 7}), Sgd(1)));
  ASSERT_OK(FinishInitParams());

  EXPECT_THAT(SendGrad(Float64Grad("bias", {1, 1, 1, 1, 1})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("'bias'"), HasSubstr("56"), HasSubstr("40"))));
  // Too long is as wrong as too short: 9 values, 72 bytes.
  EXPECT_THAT(SendGrad(Float64Grad("bias", std::vector<double>(9, 1.0))),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("'bias'"), HasSubstr("56"), HasSubstr("72"))));
  EXPECT_THAT(Float64Values("bias"), ElementsAre(1, 2, 3, 4, 5, 6, 7));
}

TEST_F(ServiceTest, GradientWithBlockLayoutOfAnotherBlockSizeIsInvalidArgument) {
  ASSERT_OK(InitParam(Float32Param("w", {1, 2}), Sgd(1)));
  ASSERT_OK(FinishInitParams());

  v1::Gradient grad = Float32Grad("w", {1, 1});
  grad.mutable_block()->set_count(2);  // the server holds w unsplit
  EXPECT_THAT(SendGrad(grad), StatusIs(absl::StatusCode::kInvalidArgument,
                                       AllOf(HasSubstr("'w'"), HasSubstr("block size"))));

  v1::GetParamRequest request;
  request.mutable_param()->set_name("w");
  request.mutable_param()->mutable_block()->set_count(3);
  EXPECT_THAT(GetParam(request), StatusIs(absl::StatusCode::kInvalidArgument,
                                          AllOf(HasSubstr("'w'"), HasSubstr("block size"))));
  EXPECT_THAT(Float32Values("w"), ElementsAre(1.0f, 2.0f));
}

TEST_F(ServiceTest, NegativeGlobalNormIsInvalidArgument) {
  ASSERT_OK(InitParam(Float32Param("w", {1, 2}), Sgd(1)));
  ASSERT_OK(FinishInitParams());
  v1::Gradient grad = Float32Grad("w", {1, 1});
  grad.set_global_norm(-1);
  EXPECT_THAT(SendGrad(grad), StatusIs(absl::StatusCode::kInvalidArgument,
                                       AllOf(HasSubstr("'w'"), HasSubstr("global_norm"))));
  EXPECT_THAT(Float32Values("w"), ElementsAre(1.0f, 2.0f));
}

TEST_F(ServiceTest, GradientOnIntegerParameterWithoutAddIsFailedPrecondition) {
  ASSERT_OK(InitParam(MakeParam<int64_t>("counts", v1::INT64, {2}, {5, 6})));
  v1::ParameterConfig add;
  add.mutable_optimizer()->mutable_add();
  ASSERT_OK(InitParam(MakeParam<int64_t>("totals", v1::INT64, {2}, {5, 6}), add));
  ASSERT_OK(FinishInitParams());

  EXPECT_THAT(SendGrad(MakeGrad<int64_t>("counts", v1::INT64, {1, 1})),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("'counts'"), HasSubstr("add"))));
  ASSERT_OK(SendGrad(MakeGrad<int64_t>("totals", v1::INT64, {1, -10})));

  ASSERT_OK_AND_ASSIGN(v1::Parameter counts, GetParam("counts"));
  EXPECT_THAT(Values<int64_t>(counts.content()), ElementsAre(5, 6));
  ASSERT_OK_AND_ASSIGN(v1::Parameter totals, GetParam("totals"));
  EXPECT_THAT(Values<int64_t>(totals.content()), ElementsAre(6, -4));
}

TEST_F(ServiceTest, SendGradsWithBadLastGradientAppliesNothing) {
  ASSERT_OK(InitParam(Float32Param("a", {1, 2}), Sgd(1)));
  ASSERT_OK(InitParam(Float64Param("b", {3, 4, 5}), Sgd(1)));
  ASSERT_OK(FinishInitParams());

  // Bad by size.
  EXPECT_THAT(
      SendGrads({Float32Grad("a", {1, 1}), Float64Grad("b", {1, 1, 1}), Float64Grad("b", {1, 1})}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'b'")));
  // Bad by type.
  EXPECT_THAT(
      SendGrads({Float32Grad("a", {1, 1}), Float64Grad("b", {1, 1, 1}), Float64Grad("a", {1, 1})}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'a'")));
  // Bad by name.
  EXPECT_THAT(
      SendGrads({Float32Grad("a", {1, 1}), Float64Grad("b", {1, 1, 1}), Float32Grad("c", {1, 1})}),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("'c'")));

  EXPECT_THAT(Float32Values("a"), ElementsAre(1.0f, 2.0f));
  EXPECT_THAT(Float64Values("b"), ElementsAre(3.0, 4.0, 5.0));
  ASSERT_OK_AND_ASSIGN(v1::ServerStats stats, GetStats());
  EXPECT_EQ(stats.gradients_applied(), 0u);

  // The good part alone applies, in order, each gradient once.
  ASSERT_OK(SendGrads(
      {Float32Grad("a", {1, 1}), Float64Grad("b", {1, 1, 1}), Float32Grad("a", {0.5f, 0.5f})}));
  EXPECT_THAT(Float32Values("a"), ElementsAre(-0.5f, 0.5f));
  EXPECT_THAT(Float64Values("b"), ElementsAre(2.0, 3.0, 4.0));
}

// ---- init validation -----------------------------------------------------------

TEST_F(ServiceTest, InitOfTransportOnlyTypeIsInvalidArgument) {
  v1::Parameter half = MakeParam<uint16_t>("half", v1::FLOAT16, {2}, {0x3c00, 0x3c00});
  EXPECT_THAT(InitParam(half), StatusIs(absl::StatusCode::kInvalidArgument,
                                        AllOf(HasSubstr("'half'"), HasSubstr("float16"))));
  v1::Parameter brain = MakeParam<uint16_t>("brain", v1::BFLOAT16, {2}, {0x3f80, 0x3f80});
  EXPECT_THAT(InitParam(brain), StatusIs(absl::StatusCode::kInvalidArgument,
                                         AllOf(HasSubstr("'brain'"), HasSubstr("bfloat16"))));
  v1::Parameter unspecified =
      MakeParam<float>("unspecified", v1::ELEMENT_TYPE_UNSPECIFIED, {1}, {1});
  EXPECT_THAT(InitParam(unspecified),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'unspecified'")));
}

TEST_F(ServiceTest, InitWithEmptyNameIsInvalidArgument) {
  EXPECT_THAT(InitParam(Float32Param("", {1})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("name is empty")));
}

TEST_F(ServiceTest, InitWithContentNotMatchingShapeIsInvalidArgument) {
  // Shape [2, 3] needs 6 values; 5 are given.
  EXPECT_THAT(InitParam(MakeParam<float>("m", v1::FLOAT32, {2, 3}, {1, 2, 3, 4, 5})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("'m'"), HasSubstr("5"), HasSubstr("6"))));
  // 7 bytes are not a whole number of float32 values.
  v1::Parameter ragged = Float32Param("ragged", {1, 2});
  ragged.mutable_content()->resize(7);
  EXPECT_THAT(InitParam(ragged), StatusIs(absl::StatusCode::kInvalidArgument,
                                          AllOf(HasSubstr("'ragged'"), HasSubstr("7 bytes"))));
  // A shape with no elements, and a negative dimension.
  EXPECT_THAT(InitParam(MakeParam<float>("empty", v1::FLOAT32, {0, 4}, {})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'empty'")));
  EXPECT_THAT(InitParam(MakeParam<float>("negative", v1::FLOAT32, {-1}, {1})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'negative'")));
  // A block index that is not below the block count.
  v1::Parameter block = Float32Param("block", {1, 2});
  block.mutable_block()->set_index(2);
  block.mutable_block()->set_count(2);
  EXPECT_THAT(InitParam(block), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'block'")));
}

TEST_F(ServiceTest, InitWithBadOptimizerHyperParameterIsInvalidArgument) {
  v1::ParameterConfig adam;
  adam.mutable_optimizer()->mutable_adam()->set_beta1(1.5);
  EXPECT_THAT(InitParam(Float32Param("w", {1, 2}), adam),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("'w'"), HasSubstr("adam.beta1"), HasSubstr("1.5"))));

  v1::ParameterConfig momentum;
  momentum.mutable_optimizer()->mutable_sgd()->set_momentum(-0.5);
  EXPECT_THAT(InitParam(Float32Param("w", {1, 2}), momentum),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("sgd.momentum")));

  v1::ParameterConfig integer_adam;
  integer_adam.mutable_optimizer()->mutable_adam();
  EXPECT_THAT(
      InitParam(MakeParam<int32_t>("i", v1::INT32, {1}, {1}), integer_adam),
      StatusIs(absl::StatusCode::kInvalidArgument, AllOf(HasSubstr("'i'"), HasSubstr("int32"))));
}

TEST_F(ServiceTest, FailedInitDoesNotTakeTheName) {
  v1::ParameterConfig adam;
  adam.mutable_optimizer()->mutable_adam()->set_beta1(1.5);
  ASSERT_THAT(InitParam(Float32Param("w", {1, 2}), adam),
              StatusCodeIs(absl::StatusCode::kInvalidArgument));
  ASSERT_THAT(InitParam(MakeParam<float>("w", v1::FLOAT32, {3}, {1})),
              StatusCodeIs(absl::StatusCode::kInvalidArgument));
  ASSERT_OK(InitParam(Float32Param("w", {7, 8})));
  ASSERT_OK(FinishInitParams());
  EXPECT_THAT(Float32Values("w"), ElementsAre(7.0f, 8.0f));
}

// ---- updates --------------------------------------------------------------------

TEST_F(ServiceTest, SgdUpdateIsVisibleThroughGetParam) {
  ASSERT_OK(InitParam(MakeParam<float>("w", v1::FLOAT32, {2, 2}, {1, 2, -3, 0.5f}), Sgd(0.5)));
  ASSERT_OK(FinishInitParams());

  ASSERT_OK(SendGrad(Float32Grad("w", {2, 4, -2, 1})));
  ASSERT_OK_AND_ASSIGN(v1::Parameter param, GetParam("w"));
  EXPECT_EQ(param.name(), "w");
  EXPECT_EQ(param.element_type(), v1::FLOAT32);
  EXPECT_THAT(param.shape(), ElementsAre(2, 2));
  EXPECT_EQ(param.block().index(), 0u);
  EXPECT_EQ(param.block().count(), 1u);
  EXPECT_EQ(param.block().offset(), 0u);
  // p - 0.5 * g, exact in binary floating point.
  EXPECT_THAT(Values<float>(param.content()), ElementsAre(0.0f, 0.0f, -2.0f, 0.0f));

  ASSERT_OK(SendGrad(Float32Grad("w", {-1, 0.25f, 8, 0})));
  EXPECT_THAT(Float32Values("w"), ElementsAre(0.5f, -0.125f, -6.0f, 0.0f));
}

TEST_F(ServiceTest, BlocksOfOneParameterAreStoredAndServedSeparately) {
  // Elements [0, 2) and [2, 3) of a [3] parameter, both on this server.
  v1::Parameter block0 = MakeParam<float>("split", v1::FLOAT32, {3}, {1, 2});
  block0.mutable_block()->set_index(0);
  block0.mutable_block()->set_count(2);
  v1::Parameter block1 = MakeParam<float>("split", v1::FLOAT32, {3}, {3});
  block1.mutable_block()->set_index(1);
  block1.mutable_block()->set_count(2);
  block1.mutable_block()->set_offset(2);
  ASSERT_OK(InitParam(block0, Sgd(1)));
  ASSERT_OK(InitParam(block1, Sgd(1)));
  EXPECT_THAT(InitParam(block1),
              StatusIs(absl::StatusCode::kAlreadyExists,
                       AllOf(StartsWith(kAlreadyInitialized), HasSubstr("block 1 of 2"))));
  ASSERT_OK(FinishInitParams());

  v1::Gradient grad1 = Float32Grad("split", {10});
  grad1.mutable_block()->set_index(1);
  grad1.mutable_block()->set_count(2);
  grad1.mutable_block()->set_offset(2);
  ASSERT_OK(SendGrad(grad1));

  // An unset block reads block 0 and tells the block count.
  ASSERT_OK_AND_ASSIGN(v1::Parameter first, GetParam("split"));
  EXPECT_EQ(first.block().count(), 2u);
  EXPECT_THAT(first.shape(), ElementsAre(3));
  EXPECT_THAT(Values<float>(first.content()), ElementsAre(1.0f, 2.0f));

  v1::GetParamRequest request;
  request.mutable_param()->set_name("split");
  request.mutable_param()->mutable_block()->set_index(1);
  request.mutable_param()->mutable_block()->set_count(2);
  ASSERT_OK_AND_ASSIGN(v1::Parameter second, GetParam(request));
  EXPECT_EQ(second.block().index(), 1u);
  EXPECT_EQ(second.block().offset(), 2u);
  EXPECT_THAT(Values<float>(second.content()), ElementsAre(-7.0f));
}

// ---- stats ----------------------------------------------------------------------

TEST_F(ServiceTest, StatsCountWhatHappened) {
  ASSERT_OK_AND_ASSIGN(v1::ServerStats stats, GetStats());
  EXPECT_EQ(stats.index(), 0u);
  EXPECT_FALSE(stats.initialized());
  EXPECT_EQ(stats.parameters(), 0u);
  EXPECT_EQ(stats.parameter_bytes(), 0u);
  EXPECT_EQ(stats.optimizer_state_bytes(), 0u);
  EXPECT_EQ(stats.gradients_applied(), 0u);
  EXPECT_EQ(stats.gets_served(), 0u);
  EXPECT_EQ(stats.requests_rejected(), 0u);
  EXPECT_GE(stats.uptime_seconds(), 0.0);

  // 16 + 24 bytes; Adam keeps two float32 slots per element (2 * 4 * 4 bytes).
  v1::ParameterConfig adam;
  adam.mutable_optimizer()->mutable_adam();
  ASSERT_OK(InitParam(Float32Param("a", {1, 2, 3, 4}), adam));
  ASSERT_OK(InitParam(Float64Param("b", {1, 2, 3}), Sgd(1)));
  // Three rejected requests: a second init, a read and a write before Finish.
  EXPECT_THAT(InitParam(Float64Param("b", {1, 2, 3})),
              StatusCodeIs(absl::StatusCode::kAlreadyExists));
  EXPECT_THAT(GetParam("a"), StatusCodeIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(SendGrad(Float32Grad("a", {1, 1, 1, 1})),
              StatusCodeIs(absl::StatusCode::kFailedPrecondition));

  ASSERT_OK_AND_ASSIGN(stats, GetStats());
  EXPECT_FALSE(stats.initialized());
  EXPECT_EQ(stats.parameters(), 2u);
  EXPECT_EQ(stats.parameter_bytes(), 40u);
  EXPECT_EQ(stats.optimizer_state_bytes(), 32u);
  EXPECT_EQ(stats.requests_rejected(), 3u);
  EXPECT_EQ(stats.gradients_applied(), 0u);
  EXPECT_EQ(stats.gets_served(), 0u);

  ASSERT_OK(FinishInitParams());
  // Three gradients applied (one alone, two in a batch); a bad batch and an
  // unknown name rejected; three blocks served (one alone, two in a batch).
  ASSERT_OK(SendGrad(Float32Grad("a", {1, 1, 1, 1})));
  ASSERT_OK(SendGrads({Float32Grad("a", {1, 1, 1, 1}), Float64Grad("b", {1, 1, 1})}));
  EXPECT_THAT(SendGrads({Float64Grad("b", {1, 1, 1}), Float64Grad("b", {1})}),
              StatusCodeIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(GetParam("nope"), StatusCodeIs(absl::StatusCode::kNotFound));
  ASSERT_OK(GetParam("a").status());
  ASSERT_OK(GetParams({"a", "b"}).status());

  ASSERT_OK_AND_ASSIGN(stats, GetStats());
  EXPECT_EQ(stats.index(), 0u);
  EXPECT_TRUE(stats.initialized());
  EXPECT_EQ(stats.parameters(), 2u);
  EXPECT_EQ(stats.parameter_bytes(), 40u);
  EXPECT_EQ(stats.optimizer_state_bytes(), 32u);
  EXPECT_EQ(stats.gradients_applied(), 3u);
  EXPECT_EQ(stats.gets_served(), 3u);
  EXPECT_EQ(stats.requests_rejected(), 5u);
}

TEST_F(ServiceTest, StatsReportTheServerIndex) {
  ServerOptions options;
  options.index = 7;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Server> other, Server::Start(options));
  EXPECT_EQ(other->index(), 7u);
  EXPECT_NE(other->port(), server_->port());
  auto stub = v1::ParameterServer::NewStub(
      grpc::CreateChannel(other->address(), grpc::InsecureChannelCredentials()));
  ASSERT_OK_AND_ASSIGN(v1::ServerStats stats, GetStatsFrom(stub.get()));
  EXPECT_EQ(stats.index(), 7u);
  other->Shutdown();
}

// ---- concurrency ------------------------------------------------------------------

TEST_F(ServiceTest, ConcurrentGradientsAreAllApplied) {
  constexpr int kThreads = 4;
  constexpr int kGradsPerThread = 100;
  constexpr int kElements = 16;
  ASSERT_OK(InitParam(Float64Param("shared", std::vector<double>(kElements, 0.0)), Sgd(1)));
  ASSERT_OK(FinishInitParams());

  std::vector<absl::Status> failures(kThreads);
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([this, t, &failures] {
      // Each thread has its own channel, so the calls really overlap.
      grpc::ChannelArguments args = DefaultChannelArguments();
      auto stub = v1::ParameterServer::NewStub(
          grpc::CreateCustomChannel(server_->address(), grpc::InsecureChannelCredentials(), args));
      v1::SendGradRequest request;
      *request.mutable_gradient() = Float64Grad("shared", std::vector<double>(kElements, 1.0));
      for (int i = 0; i < kGradsPerThread; ++i) {
        v1::SendGradResponse response;
        grpc::ClientContext context;
        SetDeadline(&context);
        grpc::Status status = stub->SendGrad(&context, request, &response);
        if (!status.ok()) {
          failures[t] = FromGrpcStatus(status);
          return;
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const absl::Status& failure : failures) EXPECT_OK(failure);

  const double expected = -1.0 * kThreads * kGradsPerThread;
  EXPECT_THAT(Float64Values("shared"), ElementsAreArray(std::vector<double>(kElements, expected)));
  ASSERT_OK_AND_ASSIGN(v1::ServerStats stats, GetStats());
  EXPECT_EQ(stats.gradients_applied(), static_cast<uint64_t>(kThreads * kGradsPerThread));
}

// ---- waiting calls and slow readers ------------------------------------------

// Threads of this process (client and server together).
size_t ThreadCount() {
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return 0;
  size_t n = 0;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n;
}

// Asynchronous calls started on one completion queue and finished, cancelled
// or left unread as a test needs; every call is drained before it is freed.
template <typename Response>
class AsyncCalls {
 public:
  struct Call {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientAsyncResponseReader<Response>> reader;
    Response response;
    grpc::Status status;
    bool finishing = false;
  };

  ~AsyncCalls() {
    for (auto& call : calls_) call->context.TryCancel();
    FinishAll();
    Drain();
  }

  // `prepare(context, cq)` returns the call's reader (stub->PrepareAsyncX).
  template <typename Prepare>
  Call& Start(Prepare prepare, std::chrono::seconds timeout) {
    calls_.push_back(std::make_unique<Call>());
    Call& call = *calls_.back();
    call.context.set_deadline(std::chrono::system_clock::now() + timeout);
    call.reader = prepare(&call.context, &cq_);
    call.reader->StartCall();
    return call;
  }
  // Asks for the replies (a call not finished is never read).
  void FinishAll() {
    for (auto& call : calls_) {
      if (call->finishing) continue;
      call->finishing = true;
      call->reader->Finish(&call->response, &call->status, call.get());
    }
  }
  void CancelAll() {
    for (auto& call : calls_) call->context.TryCancel();
  }
  // Waits (within 30 s) for every finishing call's status; false if some
  // did not come.
  bool Drain() {
    const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(30);
    while (done_ < Finishing()) {
      void* tag;
      bool ok;
      if (cq_.AsyncNext(&tag, &ok, deadline) != grpc::CompletionQueue::GOT_EVENT) return false;
      ++done_;
    }
    return true;
  }
  const std::vector<std::unique_ptr<Call>>& calls() const { return calls_; }

 private:
  size_t Finishing() const {
    size_t n = 0;
    for (const auto& call : calls_) n += call->finishing;
    return n;
  }
  grpc::CompletionQueue cq_;
  std::vector<std::unique_ptr<Call>> calls_;
  size_t done_ = 0;
};

class WaitingCallsTest : public ServiceTest {
 protected:
  void SetUp() override {}  // each test starts its own server

  void Start(ServerOptions options) {
    ASSERT_OK_AND_ASSIGN(server_, Server::Start(options));
    grpc::ChannelArguments args = DefaultChannelArguments();  // no receive limit
    channel_ =
        grpc::CreateCustomChannel(server_->address(), grpc::InsecureChannelCredentials(), args);
    stub_ = v1::ParameterServer::NewStub(channel_);
  }

  absl::StatusOr<v1::TableStatsResponse> TableStats() {
    v1::TableStatsResponse response;
    grpc::ClientContext context;
    SetDeadline(&context);
    absl::Status status =
        FromGrpcStatus(stub_->TableStats(&context, v1::TableStatsRequest(), &response));
    if (!status.ok()) return status;
    return response;
  }

  // Polls `done` (bounded: 30 s) until it holds.
  template <typename Done>
  bool Await(Done done) {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (!done()) {
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return true;
  }

  bool AwaitTableStats(uint64_t waiting, uint64_t rounds, uint64_t bytes) {
    return Await([&] {
      absl::StatusOr<v1::TableStatsResponse> stats = TableStats();
      return stats.ok() && stats->waiting_calls() == waiting &&
             stats->collective_rounds() == rounds && stats->collective_bytes() == bytes;
    });
  }
};

TEST_F(WaitingCallsTest, WaitingCallsHoldNoThreadAndCancelFreesThem) {
  ServerOptions options;
  options.num_threads = 4;
  Start(options);
  // A BSP table whose reads by w1 at clock 1 wait for w0.
  v1::CreateTableRequest create;
  create.set_name("bsp");
  create.mutable_config()->set_dim(1);
  create.mutable_config()->mutable_consistency()->set_model(v1::Consistency::BSP);
  {
    v1::CreateTableResponse response;
    grpc::ClientContext context;
    SetDeadline(&context);
    ASSERT_OK(FromGrpcStatus(stub_->CreateTable(&context, create, &response)));
  }
  for (const char* worker : {"w0", "w1"}) {
    v1::ClockRequest join;
    join.set_table("bsp");
    join.set_worker(worker);
    join.set_op(v1::ClockRequest::JOIN);
    v1::ClockResponse response;
    grpc::ClientContext context;
    SetDeadline(&context);
    ASSERT_OK(FromGrpcStatus(stub_->Clock(&context, join, &response)));
  }
  ASSERT_OK(GetStats().status());
  const size_t threads_before = ThreadCount();

  constexpr int kBarriers = 200;
  constexpr int kReads = 20;
  AsyncCalls<v1::BarrierResponse> barriers;
  for (int i = 0; i < kBarriers; ++i) {
    v1::BarrierRequest request;
    request.set_name("everyone");
    request.set_generation(1);
    request.set_size(1000000);
    request.set_participant(absl::StrCat("w", i));
    barriers.Start(
        [&](grpc::ClientContext* context, grpc::CompletionQueue* cq) {
          return stub_->PrepareAsyncBarrier(context, request, cq);
        },
        std::chrono::seconds(120));
  }
  AsyncCalls<v1::TablePullResponse> reads;
  for (int i = 0; i < kReads; ++i) {
    v1::TablePullRequest request;
    request.set_table("bsp");
    const uint64_t key = i;
    request.set_keys(std::string(reinterpret_cast<const char*>(&key), sizeof(key)));
    request.set_worker("w1");
    request.set_clock(1);
    reads.Start(
        [&](grpc::ClientContext* context, grpc::CompletionQueue* cq) {
          return stub_->PrepareAsyncTablePull(context, request, cq);
        },
        std::chrono::seconds(120));
  }
  barriers.FinishAll();
  reads.FinishAll();
  ASSERT_TRUE(AwaitTableStats(kBarriers + kReads, 1, 0)) << "the calls never all waited";

  // Ordinary calls still answer, and the waiting calls took no thread each.
  ASSERT_OK(GetStats().status());
  ASSERT_OK(InitParam(Float32Param("p", {1, 2})));
  const size_t threads_waiting = ThreadCount();
  EXPECT_LT(threads_waiting, threads_before + kBarriers / 4)
      << threads_before << " threads before, " << threads_waiting << " with " << kBarriers + kReads
      << " calls waiting";

  // Cancelled, they leave nothing behind.
  barriers.CancelAll();
  reads.CancelAll();
  ASSERT_TRUE(barriers.Drain());
  ASSERT_TRUE(reads.Drain());
  for (const auto& call : barriers.calls()) {
    EXPECT_EQ(call->status.error_code(), grpc::StatusCode::CANCELLED);
  }
  EXPECT_TRUE(AwaitTableStats(0, 0, 0)) << "cancelled calls still wait in the server";
}

TEST_F(WaitingCallsTest, CancelledAllReducesFreeTheirChunksAndDeadlinesExplain) {
  Start(ServerOptions{});
  constexpr int kCalls = 8;
  constexpr size_t kChunk = 2 << 20;
  AsyncCalls<v1::AllReduceResponse> calls;
  for (int i = 0; i < kCalls; ++i) {
    v1::AllReduceRequest request;
    request.set_name("grad");
    request.set_generation(1);
    request.set_size(1000000);
    request.set_participant(absl::StrCat("w", i));
    request.set_element_type(v1::FLOAT32);
    request.set_data(std::string(kChunk, '\0'));
    calls.Start(
        [&](grpc::ClientContext* context, grpc::CompletionQueue* cq) {
          return stub_->PrepareAsyncAllReduce(context, request, cq);
        },
        std::chrono::seconds(120));
  }
  calls.FinishAll();
  ASSERT_TRUE(AwaitTableStats(kCalls, 1, kCalls * kChunk)) << "the chunks never all arrived";
  calls.CancelAll();
  ASSERT_TRUE(calls.Drain());
  EXPECT_TRUE(AwaitTableStats(0, 0, 0)) << "cancelled all-reduces still hold their chunks";

  // A deadline still completes with the server's explanation.
  v1::BarrierRequest request;
  request.set_name("late");
  request.set_generation(1);
  request.set_size(2);
  request.set_participant("w0");
  v1::BarrierResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
  EXPECT_THAT(FromGrpcStatus(stub_->Barrier(&context, request, &response)),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("barrier 'late' round 1: 1 of 2 arrived (w0)")));
  EXPECT_TRUE(AwaitTableStats(0, 0, 0));
}

TEST_F(WaitingCallsTest, WaitingAllReducesAreCappedByMaxCollectiveBytes) {
  constexpr size_t kChunk = 1 << 20;
  ServerOptions options;
  options.max_collective_bytes = 3 * kChunk + kChunk / 2;  // room for three chunks
  Start(options);
  auto request = [&](const std::string& name, const std::string& participant) {
    v1::AllReduceRequest r;
    r.set_name(name);
    r.set_generation(1);
    r.set_size(2);
    r.set_participant(participant);
    r.set_element_type(v1::FLOAT32);
    r.set_data(std::string(kChunk, '\0'));
    return r;
  };
  AsyncCalls<v1::AllReduceResponse> waiting;
  auto start_waiting = [&](const std::string& name) {
    const v1::AllReduceRequest r = request(name, "w0");
    waiting.Start(
        [&](grpc::ClientContext* context, grpc::CompletionQueue* cq) {
          return stub_->PrepareAsyncAllReduce(context, r, cq);
        },
        std::chrono::seconds(120));
    waiting.FinishAll();
  };
  auto all_reduce = [&](const std::string& name, const std::string& participant) {
    v1::AllReduceResponse response;
    grpc::ClientContext context;
    SetDeadline(&context);
    return FromGrpcStatus(stub_->AllReduce(&context, request(name, participant), &response));
  };

  for (const char* name : {"r1", "r2", "r3"}) start_waiting(name);
  ASSERT_TRUE(AwaitTableStats(3, 3, 3 * kChunk)) << "the chunks never all arrived";
  // Full: one more that would wait is refused at once (UNAVAILABLE: clients
  // retry), naming the flag and the bytes; nothing is stored.
  EXPECT_THAT(all_reduce("r4", "w0"),
              StatusIs(absl::StatusCode::kUnavailable,
                       AllOf(HasSubstr("--max_collective_bytes"),
                             HasSubstr(absl::StrCat("holds ", 3 * kChunk)),
                             HasSubstr(absl::StrCat("needs ", kChunk)), HasSubstr("retry"))));
  ASSERT_TRUE(AwaitTableStats(3, 3, 3 * kChunk));
  // Completing a round frees its chunk; then a new waiting one is accepted.
  ASSERT_OK(all_reduce("r1", "w1"));
  ASSERT_TRUE(AwaitTableStats(2, 2, 2 * kChunk));
  start_waiting("r4");
  ASSERT_TRUE(AwaitTableStats(3, 3, 3 * kChunk));
  // Cancelling frees the rest.
  waiting.CancelAll();
  ASSERT_TRUE(waiting.Drain());
  EXPECT_OK(FromGrpcStatus(waiting.calls()[0]->status));  // r1 completed
  EXPECT_TRUE(AwaitTableStats(0, 0, 0));
  // A chunk larger than the whole limit never fits: RESOURCE_EXHAUSTED.
  v1::AllReduceRequest huge = request("r5", "w0");
  huge.set_data(std::string(4 * kChunk, '\0'));
  v1::AllReduceResponse response;
  grpc::ClientContext context;
  SetDeadline(&context);
  EXPECT_THAT(FromGrpcStatus(stub_->AllReduce(&context, huge, &response)),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("larger than the server's whole limit")));
}

TEST_F(WaitingCallsTest, ZeroCollectiveCapIsRefused) {
  ServerOptions options;
  options.max_collective_bytes = 0;
  EXPECT_THAT(Server::Start(options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_collective_bytes")));
}

// GetParam calls that ask and never read their replies: each has its own
// connection, whose flow-control window holds far less than a reply (no read
// is pending), so the server holds each reply until Cancel.
class SlowReaders {
 public:
  // Starts `n` readers of `param` on the server at `address`.
  bool Start(const std::string& address, const std::string& param, int n) {
    v1::GetParamRequest request;
    request.mutable_param()->set_name(param);
    grpc::ByteBuffer request_bytes;
    bool own_buffer = false;
    if (!grpc::SerializationTraits<v1::GetParamRequest>::Serialize(request, &request_bytes,
                                                                   &own_buffer)
             .ok()) {
      return false;
    }
    for (int i = 0; i < n; ++i) {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
      auto reader = std::make_unique<Reader>();
      reader->stub = std::make_unique<grpc::GenericStub>(
          grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
      reader->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
      reader->call =
          reader->stub->PrepareCall(&reader->context, "/pserver.v1.ParameterServer/GetParam", &cq_);
      // One operation of each kind at a time: each is awaited.
      reader->call->StartCall(reader.get());
      if (!AwaitOne()) return false;
      reader->call->Write(request_bytes, reader.get());
      if (!AwaitOne()) return false;
      reader->call->WritesDone(reader.get());
      if (!AwaitOne()) return false;
      readers_.push_back(std::move(reader));
    }
    return true;
  }

  // Cancels every reader and waits (bounded) until each call has finished.
  bool Cancel() {
    for (auto& reader : readers_) {
      reader->context.TryCancel();
      reader->call->Finish(&reader->status, reader.get());
    }
    for (size_t i = 0; i < readers_.size(); ++i) {
      if (!AwaitOne()) return false;
    }
    readers_.clear();
    return true;
  }

  ~SlowReaders() {
    Cancel();
    cq_.Shutdown();
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) {
    }
  }

 private:
  struct Reader {
    std::unique_ptr<grpc::GenericStub> stub;
    grpc::ClientContext context;
    std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call;
    grpc::Status status;
  };

  bool AwaitOne() {
    void* tag;
    bool ok;
    return cq_.AsyncNext(&tag, &ok, std::chrono::system_clock::now() + std::chrono::seconds(30)) ==
           grpc::CompletionQueue::GOT_EVENT;
  }

  grpc::CompletionQueue cq_;
  std::vector<std::unique_ptr<Reader>> readers_;
};

class ReplyBudgetTest : public WaitingCallsTest {
 protected:
  static constexpr size_t kFloats = 2 << 20;     // 8 MiB replies
  static constexpr uint64_t kBudget = 20 << 20;  // room for two

  // A server with the budget, parameter "big" (one 8 MiB block) and two
  // slow readers of it holding their replies.
  void StartWithBudgetFull() {
    ServerOptions options;
    options.max_reply_bytes_in_flight = kBudget;
    Start(options);
    ASSERT_OK(InitParam(Float32Param("big", std::vector<float>(kFloats, 1.0f))));
    ASSERT_OK(FinishInitParams());
    ASSERT_TRUE(slow_readers_.Start(server_->address(), "big", 2));
    ASSERT_TRUE(Await([&] {
      absl::StatusOr<v1::ServerStats> stats = GetStats();
      held_ = stats.ok() ? stats->reply_bytes_in_flight() : 0;
      return held_ > 2 * kFloats * sizeof(float);
    })) << "the unread replies are not held: "
        << held_;
  }

  // Cancels the slow readers and waits until their replies are released.
  void FreeTheBudget() {
    ASSERT_TRUE(slow_readers_.Cancel());
    ASSERT_TRUE(Await([&] {
      absl::StatusOr<v1::ServerStats> now = GetStats();
      return now.ok() && now->reply_bytes_in_flight() == 0;
    }));
  }

  uint64_t Refused() {
    absl::StatusOr<v1::ServerStats> stats = GetStats();
    return stats.ok() ? stats->reads_refused_for_memory() : 0;
  }

  SlowReaders slow_readers_;
  uint64_t held_ = 0;  // reply bytes the slow readers hold
};

TEST_F(ReplyBudgetTest, UnreadRepliesAreBoundedByTheReplyBudget) {
  StartWithBudgetFull();

  // Over the budget: refused for now (UNAVAILABLE, which clients retry),
  // naming the flag; nothing more is held.
  EXPECT_THAT(GetParam("big"),
              StatusIs(absl::StatusCode::kUnavailable,
                       AllOf(HasSubstr("--max_reply_bytes_in_flight"), HasSubstr("retry"))));
  EXPECT_THAT(GetParams({"big"}),
              StatusIs(absl::StatusCode::kUnavailable,
                       AllOf(HasSubstr("--max_reply_bytes_in_flight"), HasSubstr("retry"))));
  ASSERT_OK_AND_ASSIGN(v1::ServerStats stats, GetStats());
  EXPECT_EQ(stats.reply_bytes_in_flight(), held_);
  EXPECT_LE(stats.reply_bytes_in_flight(), kBudget);
  EXPECT_EQ(stats.reads_refused_for_memory(), 2u);

  // Once the slow readers go away, reads are served again.
  FreeTheBudget();
  ASSERT_OK_AND_ASSIGN(v1::Parameter param, GetParam("big"));
  EXPECT_EQ(param.content().size(), kFloats * sizeof(float));
  ASSERT_OK_AND_ASSIGN(stats, GetStats());
  EXPECT_EQ(stats.reply_bytes_in_flight(), 0u);
}

TEST_F(WaitingCallsTest, AReplyLargerThanTheWholeBudgetIsRefusedForGood) {
  ServerOptions options;
  options.max_reply_bytes_in_flight = 1 << 20;
  Start(options);
  ASSERT_OK(InitParam(Float32Param("big", std::vector<float>(1 << 20, 1.0f))));  // 4 MiB
  ASSERT_OK(FinishInitParams());
  EXPECT_THAT(GetParam("big"), StatusIs(absl::StatusCode::kResourceExhausted,
                                        AllOf(HasSubstr("larger than the server's whole budget"),
                                              HasSubstr("--max_reply_bytes_in_flight=1048576"))));
  EXPECT_THAT(GetParams({"big"}), StatusIs(absl::StatusCode::kResourceExhausted,
                                           HasSubstr("--max_reply_bytes_in_flight")));
  ASSERT_OK_AND_ASSIGN(v1::ServerStats stats, GetStats());
  EXPECT_EQ(stats.reply_bytes_in_flight(), 0u);
}

TEST_F(ReplyBudgetTest, ClientRetriesAReadRefusedWhileTheBudgetIsFull) {
  StartWithBudgetFull();
  const uint64_t refused_before = Refused();
  ClientOptions client_options;
  client_options.servers = {server_->address()};
  client_options.block_bytes = kFloats * sizeof(float);  // "big" is one block (8 MiB)
  client_options.timeout = absl::Seconds(120);
  client_options.initial_backoff = absl::Milliseconds(5);
  client_options.max_backoff = absl::Milliseconds(50);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(client_options));

  absl::StatusOr<Tensor> read = absl::UnknownError("not read");
  std::thread reader([&] { read = client->GetParam("big"); });
  // The client's read is refused (counted), then retried, not failed.
  const bool refused = Await([&] { return Refused() >= refused_before + 2; });
  FreeTheBudget();
  reader.join();
  ASSERT_TRUE(refused) << "the client's read was never refused";
  ASSERT_OK(read.status());
  EXPECT_EQ(read->num_elements(), static_cast<int64_t>(kFloats));
  EXPECT_GE(client->retries(), 2u);
}

TEST_F(WaitingCallsTest, ZeroReplyBudgetIsRefused) {
  ServerOptions options;
  options.max_reply_bytes_in_flight = 0;
  EXPECT_THAT(Server::Start(options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_reply_bytes_in_flight")));
}

}  // namespace
}  // namespace pserver
