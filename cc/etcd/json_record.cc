#include "cc/etcd/json_record.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"

namespace pserver {

std::string ParseJsonRecord(absl::string_view value, size_t max_bytes,
                            google::protobuf::Message* message) {
  if (value.size() > max_bytes) {
    return absl::StrCat("it is ", value.size(), " bytes, more than ", max_bytes);
  }
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;  // written by a later release: still readable
  auto parsed = google::protobuf::util::JsonStringToMessage(std::string(value), message, options);
  if (!parsed.ok()) {
    return absl::StrCat("'", absl::CHexEscape(value.substr(0, 200)), "' is not ",
                        message->GetDescriptor()->name(), " JSON (",
                        std::string(parsed.message()), ")");
  }
  return "";
}

std::string FormatJsonRecord(const google::protobuf::Message& message, bool print_defaults) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = print_defaults;
  // The records converted here have no Any and no maps of odd keys.
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  return json;
}

}  // namespace pserver
