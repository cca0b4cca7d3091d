// Config settings by name, derived from the proto descriptors: how the C ABI
// (and through it Python and Go) sets a ParameterConfig or TableConfig from
// "key = number", chooses an optimizer by name, and reads or writes text
// format, without a hand-written table per field.
//
//   v1::ParameterConfig config;
//   PS_RETURN_IF_ERROR(ChooseOneof(config.mutable_optimizer(), "kind", "adam", "optimizer"));
//   PS_RETURN_IF_ERROR(SetParameterSetting(&config, "beta1", 0.8));
//   PS_RETURN_IF_ERROR(SetParameterSetting(&config, "lr", 0.1));  // learning_rate
//
// A setting names a scalar field of one of the config's messages (searched
// in a fixed order, see below); errors are INVALID_ARGUMENT naming the key,
// and a failed set changes nothing. Thread-compatible (no state).
#ifndef PSERVER_CC_CORE_CONFIG_FIELDS_H_
#define PSERVER_CC_CORE_CONFIG_FIELDS_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "pserver/v1/config.pb.h"
#include "pserver/v1/table.pb.h"

namespace pserver {

// Chooses member `name` of oneof `oneof` of `msg` (an optimizer, schedule or
// initializer), clearing its settings. INVALID_ARGUMENT "unknown <what>
// '<name>'; want one of <the oneof's members>" for any other name.
absl::Status ChooseOneof(google::protobuf::Message* msg, absl::string_view oneof,
                         absl::string_view name, absl::string_view what);

// Sets `key` ("lr" is learning_rate) in the chosen optimizer (SGD if none),
// the learning-rate schedule, its decay, or the clipping, in that order; then
// the wire compression's topk_fraction and topk_count.
absl::Status SetParameterSetting(v1::ParameterConfig* config, const std::string& key, double value);

// Sets `key` ("lr" is learning_rate) in the chosen row optimizer (SGD if
// none), the chosen initializer, the initializer, eviction, consistency or
// the table config itself, in that order, then the wire compression's
// topk_fraction, topk_count and max_residual_rows; enum fields are not
// settings.
absl::Status SetTableSetting(v1::TableConfig* config, const std::string& key, double value);

// Parses protobuf text format into *out, all or nothing: INVALID_ARGUMENT
// naming the message type and the first error's line and column.
absl::Status ParseConfigText(absl::string_view text, google::protobuf::Message* out);

// `msg` in one line of text format (no trailing blank).
std::string ConfigText(const google::protobuf::Message& msg);

}  // namespace pserver

#endif  // PSERVER_CC_CORE_CONFIG_FIELDS_H_
