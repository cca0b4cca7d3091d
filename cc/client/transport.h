// Transport: how a client reaches one server. The client speaks only to this
// interface; GrpcTransport carries calls over gRPC, and an in-process
// transport can call a server's store directly.
//
// Every call is asynchronous: `request` and `response` must stay alive until
// `done` runs; `done` runs exactly once, on any thread, after the deadline at
// the latest (with DEADLINE_EXCEEDED). Implementations are thread-safe.
#ifndef PSERVER_CC_CLIENT_TRANSPORT_H_
#define PSERVER_CC_CLIENT_TRANSPORT_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "pserver/v1/service.pb.h"

namespace pserver {

class Transport {
 public:
  using Done = std::function<void(absl::Status)>;

  virtual ~Transport() = default;

  // Where this transport leads, for error messages ("127.0.0.1:7000").
  virtual const std::string& address() const = 0;

  virtual void InitParam(const v1::InitParamRequest& request, v1::InitParamResponse* response,
                         absl::Time deadline, Done done) = 0;
  virtual void FinishInitParams(const v1::FinishInitParamsRequest& request,
                                v1::FinishInitParamsResponse* response, absl::Time deadline,
                                Done done) = 0;
  virtual void GetParams(const v1::GetParamsRequest& request, v1::GetParamsResponse* response,
                         absl::Time deadline, Done done) = 0;
  virtual void SendGrads(const v1::SendGradsRequest& request, v1::SendGradsResponse* response,
                         absl::Time deadline, Done done) = 0;
  virtual void GetStats(const v1::GetStatsRequest& request, v1::GetStatsResponse* response,
                        absl::Time deadline, Done done) = 0;
};

}  // namespace pserver

#endif  // PSERVER_CC_CLIENT_TRANSPORT_H_
