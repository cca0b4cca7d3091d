// CallGroup: waits for a set of asynchronous transport calls started together.
//
//   CallGroup group;
//   for (...) transport->GetParams(req, &resp, deadline, group.Add(address));
//   PS_RETURN_IF_ERROR(group.Wait());
//
// Wait returns the first failure in the order the calls were added, its message
// followed by " (server <label>)". Thread-safe: callbacks may run anywhere.
#ifndef PSERVER_CC_CLIENT_CALL_GROUP_H_
#define PSERVER_CC_CLIENT_CALL_GROUP_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "cc/client/transport.h"

namespace pserver {

class CallGroup {
 public:
  CallGroup() = default;
  CallGroup(const CallGroup&) = delete;
  CallGroup& operator=(const CallGroup&) = delete;
  // Waits for calls still running, so callbacks never outlive the group.
  ~CallGroup();

  // The completion callback for one more call to `label`.
  Transport::Done Add(std::string label);

  // Blocks until every added call has completed.
  absl::Status Wait();

  // Blocks until every added call has completed; each call's own status, in
  // the order they were added (messages not annotated).
  std::vector<absl::Status> WaitAll();

 private:
  absl::Mutex mu_;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<absl::Status> results_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> labels_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pserver

#endif  // PSERVER_CC_CLIENT_CALL_GROUP_H_
