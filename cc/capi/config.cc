// The C ABI: parameter and table configs, set by name through the proto
// descriptors (cc/core/config_fields.h).
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "cc/capi/internal.h"
#include "cc/core/config_fields.h"
#include "cc/core/status_macros.h"

using pserver_capi::NewHandle;
using pserver_capi::Null;
using pserver_capi::Run;

namespace {

// Chooses member `name` of `oneof` in `msg`; `what` names it in errors.
absl::Status Choose(google::protobuf::Message* msg, const char* oneof, const char* name,
                    const char* what) {
  if (name == nullptr) return Null(what);
  return pserver::ChooseOneof(msg, oneof, name, what);
}

absl::Status ParseText(const char* text, google::protobuf::Message* out) {
  if (text == nullptr) return Null("text");
  return pserver::ParseConfigText(text, out);
}

// `msg` in one line of text format into out (NUL-terminated, cut to
// out_size); returns the whole text's length.
size_t WriteText(const google::protobuf::Message* msg, char* out, size_t out_size) {
  try {
    return pserver_capi::WriteString(msg == nullptr ? "" : pserver::ConfigText(*msg), out,
                                     out_size);
  } catch (...) {
    if (out != nullptr && out_size > 0) out[0] = '\0';
    return 0;
  }
}

}  // namespace

extern "C" {

// ---------------------------------------------------------- parameter config

pserver_param_config_t* pserver_param_config_new(void) {
  return NewHandle<pserver_param_config_t>();
}

void pserver_param_config_delete(pserver_param_config_t* config) { delete config; }

void pserver_param_config_set_optimizer(pserver_param_config_t* config, const char* optimizer,
                                        pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (config == nullptr) return Null("config");
    return Choose(config->rep.mutable_optimizer(), "kind", optimizer, "optimizer");
  });
}

void pserver_param_config_set_schedule(pserver_param_config_t* config, const char* schedule,
                                       pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (config == nullptr) return Null("config");
    return Choose(config->rep.mutable_learning_rate(), "decay", schedule, "schedule");
  });
}

void pserver_param_config_set(pserver_param_config_t* config, const char* key, double value,
                              pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (config == nullptr) return Null("config");
    if (key == nullptr) return Null("key");
    return pserver::SetParameterSetting(&config->rep, key, value);
  });
}

void pserver_param_config_parse(pserver_param_config_t* config, const void* data, size_t size,
                                pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (config == nullptr) return Null("config");
    if (data == nullptr && size != 0) return Null("data");
    pserver::v1::ParameterConfig parsed;
    if (size > static_cast<size_t>(INT32_MAX) ||
        !parsed.ParseFromArray(data, static_cast<int>(size))) {
      return absl::InvalidArgumentError("not a serialized pserver.v1.ParameterConfig");
    }
    config->rep = std::move(parsed);
    return absl::OkStatus();
  });
}

void pserver_param_config_parse_text(pserver_param_config_t* config, const char* text,
                                     pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (config == nullptr) return Null("config");
    return ParseText(text, &config->rep);
  });
}

size_t pserver_param_config_text(const pserver_param_config_t* config, char* out, size_t out_size) {
  return WriteText(config == nullptr ? nullptr : &config->rep, out, out_size);
}

// -------------------------------------------------------------- table config

pserver_table_config_t* pserver_table_config_new(void) {
  pserver_table_config_t* config = NewHandle<pserver_table_config_t>();
  if (config != nullptr) config->rep.set_dim(1);
  return config;
}

void pserver_table_config_delete(pserver_table_config_t* config) { delete config; }

void pserver_table_config_set_dim(pserver_table_config_t* config, uint32_t dim,
                                  pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (config == nullptr) return Null("config");
    if (dim < 1 || dim > (1u << 20)) {
      return absl::InvalidArgumentError(absl::StrCat("dim must be in [1, 2^20], got ", dim));
    }
    config->rep.set_dim(dim);
    return absl::OkStatus();
  });
}

void pserver_table_config_set_dtype(pserver_table_config_t* config, int32_t dtype,
                                    pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (config == nullptr) return Null("config");
    if (dtype != PSERVER_FLOAT32 && dtype != PSERVER_FLOAT64) {
      return absl::InvalidArgumentError(
          absl::StrCat("a table holds float32 or float64 values, not ", pserver_dtype_name(dtype)));
    }
    config->rep.set_element_type(static_cast<pserver::ElementType>(dtype));
    return absl::OkStatus();
  });
}

void pserver_table_config_set_wire_type(pserver_table_config_t* config, const char* type,
                                        pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (config == nullptr) return Null("config");
    if (type == nullptr) return Null("type");
    const absl::string_view t = type;
    pserver::v1::WireCompression::ValueType value;
    if (t == "float16") {
      value = pserver::v1::WireCompression::FLOAT16;
    } else if (t == "bfloat16") {
      value = pserver::v1::WireCompression::BFLOAT16;
    } else if (t == "float32") {
      value = pserver::v1::WireCompression::AS_STORED;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown wire type '", t, "'; want float16, bfloat16 or float32 (as stored)"));
    }
    config->rep.mutable_wire_compression()->set_value_type(value);
    return absl::OkStatus();
  });
}

void pserver_table_config_set_initializer(pserver_table_config_t* config, const char* kind,
                                          pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (config == nullptr) return Null("config");
    return Choose(config->rep.mutable_initializer(), "kind", kind, "initializer");
  });
}

void pserver_table_config_set_optimizer(pserver_table_config_t* config, const char* optimizer,
                                        pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (config == nullptr) return Null("config");
    return Choose(config->rep.mutable_optimizer(), "kind", optimizer, "table optimizer");
  });
}

void pserver_table_config_set_partitioning(pserver_table_config_t* config, int32_t kind,
                                           uint64_t range_begin, uint64_t range_end,
                                           pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (config == nullptr) return Null("config");
    pserver::v1::Partitioning* p = config->rep.mutable_partitioning();
    if (kind == PSERVER_PARTITION_HASH) {
      p->Clear();
      return absl::OkStatus();
    }
    if (kind != PSERVER_PARTITION_RANGE) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown partitioning ", kind, " (want 0: hash, 1: range)"));
    }
    if (range_end != 0 && range_end <= range_begin) {
      return absl::InvalidArgumentError(
          absl::StrCat("range partitioning needs range_begin < range_end, got [", range_begin, ", ",
                       range_end, ")"));
    }
    p->set_kind(pserver::v1::Partitioning::RANGE);
    p->set_range_begin(range_begin);
    p->set_range_end(range_end);
    return absl::OkStatus();
  });
}

void pserver_table_config_set_consistency(pserver_table_config_t* config, int32_t model,
                                          uint32_t staleness, pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (config == nullptr) return Null("config");
    if (model < PSERVER_ASP || model > PSERVER_SSP) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown consistency model ", model, " (want 0: ASP, 1: BSP, 2: SSP)"));
    }
    pserver::v1::Consistency* c = config->rep.mutable_consistency();
    c->set_model(static_cast<pserver::v1::Consistency::Model>(model));
    c->set_staleness(model == PSERVER_SSP ? staleness : 0);
    return absl::OkStatus();
  });
}

void pserver_table_config_set(pserver_table_config_t* config, const char* key, double value,
                              pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (config == nullptr) return Null("config");
    if (key == nullptr) return Null("key");
    return pserver::SetTableSetting(&config->rep, key, value);
  });
}

void pserver_table_config_parse_text(pserver_table_config_t* config, const char* text,
                                     pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (config == nullptr) return Null("config");
    return ParseText(text, &config->rep);
  });
}

size_t pserver_table_config_text(const pserver_table_config_t* config, char* out, size_t out_size) {
  return WriteText(config == nullptr ? nullptr : &config->rep, out, out_size);
}

size_t pserver_table_config_text_of(const pserver_table_t* table, char* out, size_t out_size) {
  return WriteText(table == nullptr ? nullptr : &table->rep->config(), out, out_size);
}

}  // extern "C"
