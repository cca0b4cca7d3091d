#include "cc/core/config_fields.h"

#include <cmath>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"

namespace pserver {
namespace {

namespace pb = google::protobuf;

// How one kind of config names its settings in errors.
struct SettingRules {
  absl::string_view noun;  // "config setting", "table setting"
};

// A scalar field that a number can set (messages and enums cannot).
bool IsSetting(const pb::FieldDescriptor* f) {
  return f != nullptr && f->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE &&
         f->cpp_type() != pb::FieldDescriptor::CPPTYPE_ENUM;
}

// The message of the chosen member of `oneof` in `msg`, or nullptr.
pb::Message* Chosen(pb::Message* msg, absl::string_view oneof) {
  const pb::Reflection* r = msg->GetReflection();
  const pb::OneofDescriptor* o = msg->GetDescriptor()->FindOneofByName(std::string(oneof));
  const pb::FieldDescriptor* f = r->GetOneofFieldDescriptor(*msg, o);
  return f == nullptr ? nullptr : r->MutableMessage(msg, f);
}

// The optimizer chosen in `optimizer`'s oneof "kind", SGD when none is.
pb::Message* ChosenOptimizer(pb::Message* optimizer) {
  if (pb::Message* chosen = Chosen(optimizer, "kind"); chosen != nullptr) return chosen;
  const pb::FieldDescriptor* sgd = optimizer->GetDescriptor()->FindFieldByName("sgd");
  return optimizer->GetReflection()->MutableMessage(optimizer, sgd);
}

absl::Status SetCount(pb::Message* msg, const pb::FieldDescriptor* f, const std::string& key,
                      double value, const SettingRules& rules) {
  const pb::Reflection* r = msg->GetReflection();
  if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_UINT32) {
    if (value < 0 || value != std::floor(value) || value > 4294967295.0) {
      return absl::InvalidArgumentError(absl::StrCat(
          rules.noun, " '", key, "' is a count (a whole number in [0, 2^32)), got ", value));
    }
    r->SetUInt32(msg, f, static_cast<uint32_t>(value));
    return absl::OkStatus();
  }
  if (value < 0 || value != std::floor(value) || value >= 18446744073709551616.0) {
    return absl::InvalidArgumentError(
        absl::StrCat("config setting '", key, "' is a count (a whole number >= 0), got ", value));
  }
  r->SetUInt64(msg, f, static_cast<uint64_t>(value));
  return absl::OkStatus();
}

absl::Status SetField(pb::Message* msg, const pb::FieldDescriptor* f, const std::string& key,
                      double value, const SettingRules& rules) {
  if (!std::isfinite(value)) {
    if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_UINT32) {
      return SetCount(msg, f, key, value, rules);
    }
    return absl::InvalidArgumentError(
        absl::StrCat("config setting '", key, "' is ", value, "; want a finite number"));
  }
  const pb::Reflection* r = msg->GetReflection();
  switch (f->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_DOUBLE:
      r->SetDouble(msg, f, value);
      return absl::OkStatus();
    case pb::FieldDescriptor::CPPTYPE_BOOL:
      if (value != 0 && value != 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("config setting '", key, "' is a boolean (0 or 1), got ", value));
      }
      r->SetBool(msg, f, value == 1);
      return absl::OkStatus();
    case pb::FieldDescriptor::CPPTYPE_UINT32:
    case pb::FieldDescriptor::CPPTYPE_UINT64:
      return SetCount(msg, f, key, value, rules);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("config setting '", key, "' cannot be set from a number"));
  }
}

// Sets `key` in the first of `places` that has it as a setting; the first
// place is the optimizer named in the error for an unknown key.
absl::Status SetInFirst(const std::vector<pb::Message*>& places, std::string key, double value,
                        const SettingRules& rules) {
  if (key == "lr") key = "learning_rate";
  for (pb::Message* msg : places) {
    const pb::FieldDescriptor* f = msg->GetDescriptor()->FindFieldByName(key);
    if (IsSetting(f)) return SetField(msg, f, key, value, rules);
  }
  std::vector<std::string> valid;
  for (pb::Message* msg : places) {
    const pb::Descriptor* d = msg->GetDescriptor();
    for (int i = 0; i < d->field_count(); ++i) {
      if (IsSetting(d->field(i))) valid.push_back(d->field(i)->name());
    }
  }
  valid.push_back("lr");
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown ", rules.noun, " '", key, "' for optimizer ", places[0]->GetDescriptor()->name(),
      "; valid settings: ", absl::StrJoin(valid, ", ")));
}

// Sets `key` on a copy of `config` and keeps it only on success.
template <typename Config, typename PlacesOf>
absl::Status SetOnCopy(Config* config, const std::string& key, double value,
                       const SettingRules& rules, PlacesOf places_of) {
  Config copy = *config;
  absl::Status s = SetInFirst(places_of(&copy), key, value, rules);
  if (s.ok()) *config = std::move(copy);
  return s;
}

// Keeps the first text-format parse error instead of logging it.
class TextErrors : public pb::io::ErrorCollector {
 public:
  void AddError(int line, pb::io::ColumnNumber column, const std::string& message) override {
    if (this->message.empty()) {
      this->message = absl::StrCat(line + 1, ":", column + 1, ": ", message);
    }
  }
  std::string message;
};

}  // namespace

absl::Status ChooseOneof(pb::Message* msg, absl::string_view oneof, absl::string_view name,
                         absl::string_view what) {
  const pb::OneofDescriptor* o = msg->GetDescriptor()->FindOneofByName(std::string(oneof));
  std::vector<std::string> valid;
  const pb::FieldDescriptor* chosen = nullptr;
  for (int i = 0; i < o->field_count(); ++i) {
    valid.push_back(o->field(i)->name());
    if (o->field(i)->name() == name) chosen = o->field(i);
  }
  if (chosen == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown ", what, " '", name, "'; want one of ", absl::StrJoin(valid, ", ")));
  }
  msg->GetReflection()->ClearField(msg, chosen);
  msg->GetReflection()->MutableMessage(msg, chosen);
  return absl::OkStatus();
}

absl::Status SetParameterSetting(v1::ParameterConfig* config, const std::string& key,
                                 double value) {
  return SetOnCopy(config, key, value, SettingRules{"config setting"}, [&key](v1::ParameterConfig* c) {
    std::vector<pb::Message*> places = {ChosenOptimizer(c->mutable_optimizer()),
                                        c->mutable_learning_rate()};
    if (pb::Message* decay = Chosen(c->mutable_learning_rate(), "decay")) {
      places.push_back(decay);
    }
    places.push_back(c->mutable_clipping());
    // topk_fraction, topk_count: only then, so that no other setting makes
    // an empty wire_compression appear in the config.
    if (v1::WireCompression::descriptor()->FindFieldByName(key) != nullptr) {
      places.push_back(c->mutable_wire_compression());
    }
    return places;
  });
}

absl::Status SetTableSetting(v1::TableConfig* config, const std::string& key, double value) {
  return SetOnCopy(config, key, value, SettingRules{"table setting"}, [&key](v1::TableConfig* c) {
    std::vector<pb::Message*> places = {ChosenOptimizer(c->mutable_optimizer())};
    if (pb::Message* init = Chosen(c->mutable_initializer(), "kind")) places.push_back(init);
    places.push_back(c->mutable_initializer());
    places.push_back(c->mutable_eviction());
    places.push_back(c->mutable_consistency());
    places.push_back(c);
    // As for parameters: only a wire compression setting makes one appear.
    if (v1::WireCompression::descriptor()->FindFieldByName(key) != nullptr) {
      places.push_back(c->mutable_wire_compression());
    }
    return places;
  });
}

absl::Status ParseConfigText(absl::string_view text, pb::Message* out) {
  std::unique_ptr<pb::Message> parsed(out->New());
  TextErrors errors;
  pb::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(std::string(text), parsed.get())) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a ", out->GetTypeName(), " in text format: ", errors.message));
  }
  out->GetReflection()->Swap(out, parsed.get());
  return absl::OkStatus();
}

std::string ConfigText(const pb::Message& msg) {
  std::string text;
  pb::TextFormat::Printer printer;
  printer.SetSingleLineMode(true);
  printer.PrintToString(msg, &text);
  while (!text.empty() && text.back() == ' ') text.pop_back();
  return text;
}

}  // namespace pserver
