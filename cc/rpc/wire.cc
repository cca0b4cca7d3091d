#include "cc/rpc/wire.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cc/core/finite.h"
#include "cc/rpc/buffer_pool.h"
#include "cc/core/names.h"
#include "grpc/slice.h"

namespace pserver {
namespace {

// Protobuf wire types.
constexpr int kVarint = 0;
constexpr int kFixed64 = 1;
constexpr int kLengthDelimited = 2;
constexpr int kFixed32 = 5;

// Field numbers of the payload-carrying fields in service.proto / types.proto.
constexpr int kRequestGradientsField = 1;  // SendGradsRequest/PushPullRequest.gradients
constexpr int kRequestParamsField = 2;     // PushPullRequest.params
constexpr int kResponseParamsField = 1;    // GetParamsResponse.parameters
constexpr int kGradientContentField = 3;   // Gradient.content
constexpr int kParameterContentField = 4;  // Parameter.content
constexpr int kRequestClientIdField = 3;   // SendGradsRequest/PushPullRequest.client_id (fixed64)
constexpr int kRequestSequenceField = 4;   // SendGradsRequest/PushPullRequest.sequence (uint64)

// Payloads up to this size are copied into the message's own bytes: a
// separate slice costs more than copying so little.
constexpr size_t kInlinePayloadBytes = 16 << 10;

// A Gradient field that types.proto never declares: padding the encoder puts
// in a gradient's header so that the content starts a multiple of
// kContentAlignment bytes into the message. A reader holding the whole message
// in one buffer aligned as malloc aligns (a bulk channel frame) then applies
// the content in place instead of copying it to aligned memory first. Every
// protobuf parser skips it as an unknown field.
constexpr int kGradientPaddingField = 2047;
constexpr size_t kContentAlignment = 16;

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void PutTag(std::string* out, int field, int wire_type) {
  PutVarint(out, (static_cast<uint64_t>(field) << 3) | wire_type);
}

size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

// Appends "field: <message header><payload field tag and length>" to `out`;
// the payload's `payload_size` bytes must follow.
void PutMessageWithPayload(std::string* out, int field, const std::string& header,
                           int payload_field, size_t payload_size) {
  const size_t payload_key = (static_cast<uint64_t>(payload_field) << 3) | kLengthDelimited;
  const size_t total = header.size() + VarintSize(payload_key) + VarintSize(payload_size) + payload_size;
  PutTag(out, field, kLengthDelimited);
  PutVarint(out, total);
  out->append(header);
  PutVarint(out, payload_key);
  PutVarint(out, payload_size);
}

// The padding field to add to a gradient's `header_size` header bytes so that
// its content (`payload_size` bytes) starts at a multiple of kContentAlignment
// when the gradient field begins `offset` bytes into the message; empty when
// none is needed or none fits.
std::string ContentPadding(size_t offset, int field, size_t header_size, int payload_field,
                           size_t payload_size) {
  const uint64_t payload_key = (static_cast<uint64_t>(payload_field) << 3) | kLengthDelimited;
  const uint64_t padding_key = (uint64_t{kGradientPaddingField} << 3) | kLengthDelimited;
  const size_t payload_prefix = VarintSize(payload_key) + VarintSize(payload_size);
  // Each padding byte more moves the content by one, so some fill of under
  // 2 * kContentAlignment bytes lines it up.
  for (size_t fill = 0; fill < 2 * kContentAlignment; ++fill) {
    const size_t padding = fill == 0 ? 0 : VarintSize(padding_key) + VarintSize(fill - 1) + fill - 1;
    const size_t total = header_size + padding + payload_prefix + payload_size;
    const size_t content_at = offset + VarintSize((static_cast<uint64_t>(field) << 3) | kLengthDelimited) +
                              VarintSize(total) + header_size + padding + payload_prefix;
    if (content_at % kContentAlignment != 0) continue;
    if (fill == 0) return "";
    std::string out;
    PutVarint(&out, padding_key);
    PutVarint(&out, fill - 1);
    out.append(fill - 1, '\0');
    return out;
  }
  return "";
}

absl::string_view View(const grpc::Slice& slice) {
  return absl::string_view(reinterpret_cast<const char*>(slice.begin()), slice.size());
}

// A cursor over bytes in several pieces. Every read is bounds-checked.
class Reader {
 public:
  explicit Reader(const Segments& segments) : segments_(segments) { Normalize(); }

  bool AtEnd() const { return index_ >= segments_.size(); }

  // The bytes read so far.
  size_t Offset() const {
    size_t n = pos_;
    for (size_t i = 0; i < index_ && i < segments_.size(); ++i) n += segments_[i].size();
    return n;
  }

  bool ReadVarint(uint64_t* value) {
    uint64_t result = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (AtEnd()) return false;
      const uint8_t byte = static_cast<uint8_t>(segments_[index_][pos_]);
      ++pos_;
      Normalize();
      result |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) {
        *value = result;
        return true;
      }
    }
    return false;  // more than 10 bytes
  }

  // The next `n` bytes, as the pieces they lie in.
  bool Take(uint64_t n, Segments* out) {
    while (n > 0) {
      if (AtEnd()) return false;
      const absl::string_view piece = segments_[index_].substr(pos_, n);
      out->push_back(piece);
      pos_ += piece.size();
      n -= piece.size();
      Normalize();
    }
    return true;
  }

 private:
  void Normalize() {
    while (index_ < segments_.size() && pos_ >= segments_[index_].size()) {
      ++index_;
      pos_ = 0;
    }
  }

  const Segments& segments_;
  size_t index_ = 0;
  size_t pos_ = 0;
};

// Whether protobuf accepts `key` as a field's key: it must fit in 32 bits (so a
// longer one cannot alias a small field number) and name a field other than 0.
bool ValidKey(uint64_t key) { return key <= 0xffffffffu && (key >> 3) != 0; }

std::string Flatten(const Segments& segments) {
  std::string out(SegmentsSize(segments), '\0');
  CopySegments(segments, out.data());
  return out;
}

// Reads the fields of one message. The field numbered `payload_field` (if
// length-delimited) is handed back as pieces in `payload`; every other field
// is re-encoded into `rest`, for protobuf to parse. Returns false on
// malformed bytes.
bool SplitMessage(const Segments& message, int payload_field, Segments* payload,
                  std::string* rest) {
  Reader reader(message);
  while (!reader.AtEnd()) {
    uint64_t key;
    if (!reader.ReadVarint(&key) || !ValidKey(key)) return false;
    const int field = static_cast<int>(key >> 3);
    const int wire_type = static_cast<int>(key & 7);
    Segments value;
    switch (wire_type) {
      case kVarint: {
        uint64_t v;
        if (!reader.ReadVarint(&v)) return false;
        PutVarint(rest, key);
        PutVarint(rest, v);
        continue;
      }
      case kFixed64:
      case kFixed32:
        if (!reader.Take(wire_type == kFixed64 ? 8 : 4, &value)) return false;
        PutVarint(rest, key);
        rest->append(Flatten(value));
        continue;
      case kLengthDelimited: {
        uint64_t length;
        if (!reader.ReadVarint(&length) || !reader.Take(length, &value)) return false;
        if (field == payload_field) {
          *payload = std::move(value);  // the last occurrence wins, as in protobuf
        } else {
          PutVarint(rest, key);
          PutVarint(rest, length);
          rest->append(Flatten(value));
        }
        continue;
      }
      default:
        return false;  // groups and unknown wire types
    }
  }
  return true;
}

// Walks the top-level fields of a message, calling visit(field, value) for
// each length-delimited one and scalar(field, wire_type, value) for each
// varint, fixed64 and fixed32 one (fixed values little-endian decoded).
template <typename Visit, typename VisitScalar>
bool ForEachField(const Segments& message, Visit visit, VisitScalar scalar) {
  Reader reader(message);
  while (!reader.AtEnd()) {
    uint64_t key;
    if (!reader.ReadVarint(&key) || !ValidKey(key)) return false;
    const int wire_type = static_cast<int>(key & 7);
    Segments value;
    if (wire_type == kVarint) {
      uint64_t v;
      if (!reader.ReadVarint(&v)) return false;
      scalar(static_cast<int>(key >> 3), wire_type, v);
    } else if (wire_type == kFixed64 || wire_type == kFixed32) {
      const int size = wire_type == kFixed64 ? 8 : 4;
      if (!reader.Take(size, &value)) return false;
      unsigned char bytes[8] = {0};
      CopySegments(value, reinterpret_cast<char*>(bytes));
      uint64_t v = 0;
      for (int i = size - 1; i >= 0; --i) v = (v << 8) | bytes[i];
      scalar(static_cast<int>(key >> 3), wire_type, v);
    } else if (wire_type == kLengthDelimited) {
      uint64_t length;
      if (!reader.ReadVarint(&length) || !reader.Take(length, &value)) return false;
      if (!visit(static_cast<int>(key >> 3), value)) return false;
    } else {
      return false;
    }
  }
  return true;
}

// ForEachField for messages whose scalar fields are of no interest.
template <typename Visit>
bool ForEachLengthDelimited(const Segments& message, Visit visit) {
  return ForEachField(message, visit, [](int, int, uint64_t) {});
}

// Names travel as protobuf `bytes` (service.proto), so protobuf no longer
// refuses (and logs) one that is not UTF-8: these decoders do, saying where.
// The rest of what makes a name valid (names.h) is the store's to check.
template <typename Messages>
absl::Status CheckNamesAreUtf8(const Messages& messages, absl::string_view malformed,
                               absl::StatusCode code) {
  for (const auto& message : messages) {
    if (FirstInvalidUtf8(message.name()) == message.name().size()) continue;
    return absl::Status(
        code, absl::StrCat(malformed, ValidateName("parameter", message.name()).message()));
  }
  return absl::OkStatus();
}

absl::Status DumpSlices(const grpc::ByteBuffer& buffer, std::vector<grpc::Slice>* slices,
                        Segments* segments) {
  grpc::Status status = buffer.Dump(slices);
  if (!status.ok()) return absl::InternalError(status.error_message());
  for (const grpc::Slice& slice : *slices) segments->push_back(View(slice));
  return absl::OkStatus();
}

}  // namespace

// ---- PayloadLease -----------------------------------------------------------------

PayloadLease::PayloadLease(std::function<void()> on_released)
    : on_released_(std::move(on_released)) {}

PayloadLease* PayloadLease::Create(std::function<void()> on_released) {
  return new PayloadLease(std::move(on_released));
}

void PayloadLease::Unref(void* arg) {
  auto* lease = static_cast<PayloadLease*>(arg);
  if (lease->refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    lease->on_released_();
    delete lease;
  }
}

void PayloadLease::Release() { Unref(this); }

grpc::Slice PayloadLease::Borrow(absl::string_view bytes) {
  refs_.fetch_add(1, std::memory_order_relaxed);
  return grpc::Slice(const_cast<char*>(bytes.data()), bytes.size(), &PayloadLease::Unref, this);
}

// ---- push requests ------------------------------------------------------------------

grpc::ByteBuffer EncodePushRequest(absl::Span<const GradientView> grads,
                                   absl::Span<const v1::ParamRef> refs, PayloadLease* lease,
                                   uint64_t client_id, uint64_t sequence) {
  std::vector<grpc::Slice> slices;
  std::string pending;
  size_t flushed = 0;  // bytes of the message in `slices`
  auto flush = [&] {
    if (!pending.empty()) slices.emplace_back(pending.data(), pending.size());
    flushed += pending.size();
    pending.clear();
  };
  // proto3 leaves zero scalars out; protobuf accepts fields in any order.
  if (client_id != 0) {
    PutTag(&pending, kRequestClientIdField, kFixed64);
    for (int i = 0; i < 8; ++i) pending.push_back(static_cast<char>(client_id >> (8 * i)));
  }
  if (sequence != 0) {
    PutTag(&pending, kRequestSequenceField, kVarint);
    PutVarint(&pending, sequence);
  }
  v1::Gradient header;
  for (const GradientView& g : grads) {
    header.Clear();
    header.set_name(g.name.data(), g.name.size());
    header.set_element_type(g.type);
    *header.mutable_block() = g.block;
    if (g.global_norm.has_value()) header.set_global_norm(*g.global_norm);
    header.set_skip_as_non_finite(g.skip_as_non_finite);
    header.set_indices(g.indices.data(), g.indices.size());  // top-k: small, copied
    std::string header_bytes = header.SerializeAsString();
    if (!g.content.empty()) {
      header_bytes += ContentPadding(flushed + pending.size(), kRequestGradientsField,
                                     header_bytes.size(), kGradientContentField, g.content.size());
    }
    PutMessageWithPayload(&pending, kRequestGradientsField, header_bytes, kGradientContentField,
                          g.content.size());
    if (g.content.size() <= kInlinePayloadBytes) {
      pending.append(g.content.data(), g.content.size());
    } else {
      flush();
      slices.push_back(lease->Borrow(g.content));
      flushed += g.content.size();
    }
  }
  for (const v1::ParamRef& ref : refs) {
    PutTag(&pending, kRequestParamsField, kLengthDelimited);
    PutVarint(&pending, ref.ByteSizeLong());
    pending.append(ref.SerializeAsString());
  }
  flush();
  return grpc::ByteBuffer(slices.data(), slices.size());
}

absl::Status DecodePushRequest(const grpc::ByteBuffer& buffer, PushRequest* out) {
  Segments message;
  absl::Status status = DumpSlices(buffer, &out->slices, &message);
  if (!status.ok()) return status;

  // Where each gradient's content is: in place, or scratch[index].
  struct Content {
    absl::string_view direct;
    int scratch = -1;
  };
  std::vector<Content> contents;
  auto scalar = [&](int field, int wire_type, uint64_t value) {
    // The last occurrence wins; a wrong wire type makes it an unknown field
    // (both as protobuf does).
    if (field == kRequestClientIdField && wire_type == kFixed64) out->client_id = value;
    if (field == kRequestSequenceField && wire_type == kVarint) out->sequence = value;
  };
  bool parsed = ForEachField(message, [&](int field, const Segments& value) {
    if (field == kRequestParamsField) {
      std::string bytes = Flatten(value);
      return out->refs.emplace_back().ParseFromString(bytes);
    }
    if (field != kRequestGradientsField) return true;  // unknown: skipped
    Segments payload;
    std::string rest;
    if (!SplitMessage(value, kGradientContentField, &payload, &rest)) return false;
    v1::Gradient& header = out->headers.emplace_back();
    if (!header.ParseFromString(rest)) return false;
    Content& content = contents.emplace_back();
    const size_t align = std::max<size_t>(1, ElementSize(header.element_type()));
    if (payload.size() == 1 &&
        reinterpret_cast<uintptr_t>(payload[0].data()) % align == 0) {
      content.direct = payload[0];
    } else if (!payload.empty()) {
      content.scratch = static_cast<int>(out->scratch.size());
      out->scratch.push_back(Flatten(payload));
    }
    return true;
  }, scalar);
  if (!parsed) {
    return absl::InvalidArgumentError("malformed push request: not a valid SendGradsRequest");
  }
  constexpr char kMalformedPush[] = "malformed push request: ";
  status = CheckNamesAreUtf8(out->headers, kMalformedPush, absl::StatusCode::kInvalidArgument);
  if (status.ok()) {
    status = CheckNamesAreUtf8(out->refs, kMalformedPush, absl::StatusCode::kInvalidArgument);
  }
  if (!status.ok()) return status;
  // Views last: the vectors above no longer move.
  out->grads.reserve(out->headers.size());
  for (size_t i = 0; i < out->headers.size(); ++i) {
    GradientView view = GradientView::Of(out->headers[i]);
    view.content = contents[i].scratch >= 0 ? absl::string_view(out->scratch[contents[i].scratch])
                                            : contents[i].direct;
    out->grads.push_back(view);
  }
  return absl::OkStatus();
}

void PushFiniteScan::Advance(size_t received) {
  received = std::min(received, message_.size());
  while (!stopped_ && parsed_ < received) {
    const Segments arrived = {message_.substr(parsed_, received - parsed_)};
    Reader reader(arrived);
    uint64_t key;
    if (!reader.ReadVarint(&key)) break;  // the key is still arriving
    if (!ValidKey(key)) {
      stopped_ = true;
      break;
    }
    const int wire_type = static_cast<int>(key & 7);
    Segments value;
    uint64_t v;
    if (wire_type == kVarint) {
      if (!reader.ReadVarint(&v)) break;
    } else if (wire_type == kFixed64 || wire_type == kFixed32) {
      if (!reader.Take(wire_type == kFixed64 ? 8 : 4, &value)) break;
    } else if (wire_type == kLengthDelimited) {
      if (!reader.ReadVarint(&v) || !reader.Take(v, &value)) break;
    } else {
      stopped_ = true;
      break;
    }
    parsed_ += reader.Offset();
    if (wire_type != kLengthDelimited || (key >> 3) != kRequestGradientsField) continue;
    // A whole gradient: its header by protobuf, its content where it lies.
    Segments payload;
    std::string rest;
    v1::Gradient header;
    if (!SplitMessage(value, kGradientContentField, &payload, &rest) ||
        !header.ParseFromString(rest) || payload.size() != 1 ||
        FindNonFinite(header.element_type(), payload[0]).has_value()) {
      continue;
    }
    finite_[payload[0].data()] = Scanned{payload[0].size(), header.element_type()};
  }
  if (received == message_.size() && parsed_ < received) stopped_ = true;  // cut short
}

bool PushFiniteScan::Finite(const GradientView& grad) const {
  auto it = finite_.find(grad.content.data());
  return it != finite_.end() && it->second.size == grad.content.size() &&
         it->second.type == grad.type;
}

// ---- params responses ---------------------------------------------------------------

void AppendParamsBlockPrefix(std::string* out, const v1::Parameter& header, size_t content_size) {
  PutMessageWithPayload(out, kResponseParamsField, header.SerializeAsString(),
                        kParameterContentField, content_size);
}

void ParamsResponseBuilder::Add(const v1::Parameter& header, size_t content_size,
                                absl::FunctionRef<void(char* dest)> fill) {
  AppendParamsBlockPrefix(&pending_, header, content_size);
  if (content_size <= kInlinePayloadBytes) {
    const size_t at = pending_.size();
    pending_.resize(at + content_size);
    fill(pending_.data() + at);
    return;
  }
  if (!pending_.empty()) slices_.emplace_back(pending_.data(), pending_.size());
  pending_.clear();
  // A warm buffer (buffer_pool.h): a 64 MiB pull's blocks would otherwise
  // be a thread arena's extra heap, unmapped once the reply is written.
  grpc::Slice slice = ProcessBufferPool().Take(content_size);
  fill(MutableData(slice));
  slices_.push_back(std::move(slice));
}

grpc::ByteBuffer ParamsResponseBuilder::Finish() {
  if (!pending_.empty()) slices_.emplace_back(pending_.data(), pending_.size());
  pending_.clear();
  grpc::ByteBuffer buffer(slices_.data(), slices_.size());
  slices_.clear();
  return buffer;
}

absl::Status DecodeParamsResponse(const grpc::ByteBuffer& buffer, ParamsResponse* out) {
  Segments message;
  absl::Status status = DumpSlices(buffer, &out->slices, &message);
  if (!status.ok()) return status;
  bool parsed = ForEachLengthDelimited(message, [&](int field, const Segments& value) {
    if (field != kResponseParamsField) return true;
    Segments payload;
    std::string rest;
    if (!SplitMessage(value, kParameterContentField, &payload, &rest)) return false;
    if (!out->headers.emplace_back().ParseFromString(rest)) return false;
    out->contents.push_back(std::move(payload));
    return true;
  });
  if (!parsed) return absl::DataLossError("malformed response: not a valid GetParamsResponse");
  return CheckNamesAreUtf8(out->headers, "malformed response: ", absl::StatusCode::kDataLoss);
}

namespace {

// A message arriving on a stream, read through a small look-ahead (a
// block's fields come a few bytes at a time; each read of some streams
// costs a system call), never past the message's end. Reads that fail
// stop it: `io()` (the stream) or `malformed()` (the bytes) says why.
class StreamedMessage {
 public:
  StreamedMessage(uint64_t bytes, absl::FunctionRef<absl::Status(char*, size_t)> read)
      : left_(bytes), read_(read) {}

  // Bytes of the message not yet taken.
  uint64_t left() const { return left_ + (ahead_end_ - ahead_begin_); }
  const absl::Status& io() const { return io_; }
  bool malformed() const { return malformed_; }
  bool Malformed() {
    malformed_ = true;
    return false;
  }

  // The next `n` bytes into `dest`: what the look-ahead holds, the rest
  // straight from the stream.
  bool Read(char* dest, uint64_t n) {
    if (n > left()) return Malformed();
    const size_t buffered = std::min<uint64_t>(n, ahead_end_ - ahead_begin_);
    std::memcpy(dest, ahead_ + ahead_begin_, buffered);
    ahead_begin_ += buffered;
    return FromStream(dest + buffered, n - buffered);
  }

  bool Varint(uint64_t* value) {
    uint64_t result = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (ahead_begin_ == ahead_end_ && !Refill()) return false;
      const uint8_t byte = static_cast<uint8_t>(ahead_[ahead_begin_++]);
      result |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) {
        *value = result;
        return true;
      }
    }
    return Malformed();  // more than 10 bytes
  }

  // Reads and drops `n` bytes.
  bool Skip(uint64_t n) {
    char piece[4096];
    while (n > 0) {
      const size_t m = std::min<uint64_t>(n, sizeof(piece));
      if (!Read(piece, m)) return false;
      n -= m;
    }
    return true;
  }

 private:
  static constexpr size_t kAheadBytes = 256;

  bool FromStream(char* dest, uint64_t n) {
    if (n == 0) return true;
    io_ = read_(dest, n);
    if (!io_.ok()) return false;
    left_ -= n;
    return true;
  }

  bool Refill() {
    const size_t n = std::min<uint64_t>(left_, kAheadBytes);
    if (n == 0) return Malformed();  // the message ends inside a field
    ahead_begin_ = 0;
    ahead_end_ = 0;
    if (!FromStream(ahead_, n)) return false;
    ahead_end_ = n;
    return true;
  }

  uint64_t left_;  // not yet read from the stream
  absl::FunctionRef<absl::Status(char*, size_t)> read_;
  char ahead_[kAheadBytes];
  size_t ahead_begin_ = 0;
  size_t ahead_end_ = 0;
  absl::Status io_;
  bool malformed_ = false;
};

// Reads one Parameter of `length` bytes from `in` (see ReadParamsResponse);
// false when `in` stopped. Once *blocks is an error, only reads.
bool ReadParamsBlock(
    StreamedMessage& in, uint64_t length,
    absl::FunctionRef<char*(const v1::Parameter&, uint64_t)> where,
    absl::FunctionRef<absl::Status(const v1::Parameter&, const Segments&)> place,
    absl::Status* blocks, ParamsReadStats* stats) {
  const uint64_t end = in.left() - length;  // in.left() once the block is read
  std::string rest;                         // every field but the content, re-encoded
  Segments content;
  grpc::Slice buffer;  // the content when not in place
  v1::Parameter header;
  size_t parsed = std::string::npos;  // `header` is the first `parsed` bytes of `rest`
  auto parse = [&] {
    if (parsed == rest.size()) return true;
    header.Clear();
    if (!header.ParseFromString(rest)) return in.Malformed();
    parsed = rest.size();
    return true;
  };
  while (in.left() > end) {
    uint64_t key;
    if (!in.Varint(&key)) return false;
    if (!ValidKey(key) || in.left() < end) return in.Malformed();
    const int field = static_cast<int>(key >> 3);
    const int wire_type = static_cast<int>(key & 7);
    if (wire_type == kVarint) {
      uint64_t v;
      if (!in.Varint(&v)) return false;
      PutVarint(&rest, key);
      PutVarint(&rest, v);
    } else if (wire_type == kFixed64 || wire_type == kFixed32) {
      char bytes[8];
      const size_t size = wire_type == kFixed64 ? 8 : 4;
      if (!in.Read(bytes, size)) return false;
      PutVarint(&rest, key);
      rest.append(bytes, size);
    } else if (wire_type == kLengthDelimited) {
      uint64_t size;
      if (!in.Varint(&size)) return false;
      if (in.left() < end || size > in.left() - end) return in.Malformed();
      if (field != kParameterContentField) {
        PutVarint(&rest, key);
        PutVarint(&rest, size);
        const size_t at = rest.size();
        rest.resize(at + size);
        if (!in.Read(rest.data() + at, size)) return false;
        continue;
      }
      // The content: in place when it is the block's last field (the
      // header is then complete) and `where` names a place for it.
      char* dest = nullptr;
      if (blocks->ok() && size > 0 && in.left() - size == end) {
        if (!parse()) return false;
        if (FirstInvalidUtf8(header.name()) == header.name().size()) dest = where(header, size);
      }
      if (dest != nullptr) {
        if (!in.Read(dest, size)) return false;
        stats->bytes_in_place += size;
        content = {absl::string_view(dest, size)};
        buffer = grpc::Slice();
      } else {
        buffer = ProcessBufferPool().Take(size);  // the last occurrence wins, as in protobuf
        if (!in.Read(MutableData(buffer), size)) return false;
        stats->bytes_buffered += size;
        content.clear();
        if (size > 0) content = {View(buffer)};
      }
    } else {
      return in.Malformed();
    }
  }
  if (in.left() != end) return in.Malformed();  // a field ran past the block
  if (!blocks->ok()) return true;
  if (!parse()) return false;
  if (FirstInvalidUtf8(header.name()) != header.name().size()) {
    *blocks = absl::DataLossError(absl::StrCat(
        "malformed response: ", ValidateName("parameter", header.name()).message()));
    return true;
  }
  *blocks = place(header, content);
  return true;
}

}  // namespace

absl::Status ReadParamsResponse(
    uint64_t bytes, absl::FunctionRef<absl::Status(char* dest, size_t n)> read,
    absl::FunctionRef<char*(const v1::Parameter& header, uint64_t size)> where,
    absl::FunctionRef<absl::Status(const v1::Parameter& header, const Segments& content)> place,
    absl::Status* blocks, ParamsReadStats* stats) {
  *blocks = absl::OkStatus();
  StreamedMessage in(bytes, read);
  while (in.left() > 0) {
    uint64_t key;
    if (!in.Varint(&key)) break;
    if (!ValidKey(key)) {
      in.Malformed();
      break;
    }
    const int wire_type = static_cast<int>(key & 7);
    uint64_t size = 0;
    if (wire_type == kVarint) {
      if (!in.Varint(&size)) break;
      continue;  // an unknown field: skipped
    }
    if (wire_type == kFixed64 || wire_type == kFixed32) {
      if (!in.Skip(wire_type == kFixed64 ? 8 : 4)) break;
      continue;
    }
    if (wire_type != kLengthDelimited) {
      in.Malformed();
      break;
    }
    if (!in.Varint(&size)) break;
    if (size > in.left()) {
      in.Malformed();
      break;
    }
    const bool read_on = (key >> 3) == kResponseParamsField
                             ? ReadParamsBlock(in, size, where, place, blocks, stats)
                             : in.Skip(size);
    if (!read_on) break;
  }
  if (!in.io().ok()) return in.io();
  if (in.malformed()) {
    *blocks = absl::DataLossError("malformed response: not a valid GetParamsResponse");
    // What is left of the message is read and dropped: the stream stays in step.
    if (!in.Skip(in.left())) return in.io();
  }
  return absl::OkStatus();
}

}  // namespace pserver
