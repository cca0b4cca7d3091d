// The JSON values of etcd keys that hold a protobuf message (/shards/<i>,
// /placement): parsed with a bound and the same refusals, formatted the
// same way. etcd's contents are untrusted input.
//
//   std::string why = ParseJsonRecord(value, kMaxBytes, &config);
//   if (!why.empty()) return refused(why);   // "it is 70000 bytes, more than 65536"
#ifndef PSERVER_CC_ETCD_JSON_RECORD_H_
#define PSERVER_CC_ETCD_JSON_RECORD_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

namespace pserver {

// Parses `value` into `message`; fields unknown to this release are ignored
// (a later release may write them). Returns "" when it parsed, else why not:
// "it is N bytes, more than <max_bytes>" or "'<value, escaped, at most 200
// bytes>' is not <message type> JSON (<the parser's error>)".
std::string ParseJsonRecord(absl::string_view value, size_t max_bytes,
                            google::protobuf::Message* message);

// `message` as JSON; with `print_defaults`, fields at their defaults too.
std::string FormatJsonRecord(const google::protobuf::Message& message, bool print_defaults);

}  // namespace pserver

#endif  // PSERVER_CC_ETCD_JSON_RECORD_H_
