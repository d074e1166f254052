#include "cc/negotiation/wire_format.h"

#include <cstdint>
#include <cstring>

namespace tfring {
namespace {

class ByteWriter {
 public:
  template <typename T>
  void Put(T value) {
    out_.append(reinterpret_cast<const char*>(&value), sizeof(T));
  }
  void PutString(const std::string& text) {
    Put<int64_t>(static_cast<int64_t>(text.size()));
    out_.append(text);
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

class ByteReader {
 public:
  explicit ByteReader(const std::string& bytes) : bytes_(bytes) {}

  template <typename T>
  bool Get(T* value) {
    if (offset_ + sizeof(T) > bytes_.size()) return false;
    std::memcpy(value, bytes_.data() + offset_, sizeof(T));
    offset_ += sizeof(T);
    return true;
  }
  bool GetString(std::string* text) {
    int64_t length = 0;
    if (!Get(&length) || length < 0 || offset_ + length > bytes_.size()) return false;
    text->assign(bytes_.data() + offset_, length);
    offset_ += length;
    return true;
  }
  bool AtEnd() const { return offset_ == bytes_.size(); }

 private:
  const std::string& bytes_;
  size_t offset_ = 0;
};

void PutRequest(ByteWriter& writer, const Request& request) {
  writer.PutString(request.name);
  writer.Put<int32_t>(static_cast<int32_t>(request.type));
  writer.Put<int32_t>(static_cast<int32_t>(request.dtype));
  writer.Put<int32_t>(static_cast<int32_t>(request.shape.size()));
  for (int64_t dim : request.shape) writer.Put<int64_t>(dim);
  writer.Put<int32_t>(static_cast<int32_t>(request.reduce_op));
  writer.Put<int32_t>(request.root_rank);
  writer.Put<double>(request.prescale_factor);
  writer.Put<double>(request.postscale_factor);
  writer.Put<int32_t>(request.rank);
  writer.Put<int32_t>(static_cast<int32_t>(request.compression));
}

bool GetRequest(ByteReader& reader, Request* request) {
  int32_t type, dtype, ndims, reduce_op, compression;
  if (!reader.GetString(&request->name) || !reader.Get(&type) || !reader.Get(&dtype) ||
      !reader.Get(&ndims) || ndims < 0) {
    return false;
  }
  request->type = static_cast<CollectiveType>(type);
  request->dtype = static_cast<DataType>(dtype);
  request->shape.resize(ndims);
  for (int32_t i = 0; i < ndims; ++i) {
    if (!reader.Get(&request->shape[i])) return false;
  }
  if (!reader.Get(&reduce_op) || !reader.Get(&request->root_rank) ||
      !reader.Get(&request->prescale_factor) || !reader.Get(&request->postscale_factor) ||
      !reader.Get(&request->rank) || !reader.Get(&compression) || compression < 0 ||
      compression > static_cast<int32_t>(WireCompression::kFp16)) {
    return false;
  }
  request->reduce_op = static_cast<ReduceOp>(reduce_op);
  request->compression = static_cast<WireCompression>(compression);
  return true;
}

Status Malformed(const char* what) {
  return Status::Internal(std::string("malformed ") + what +
                          " message between ranks; all ranks must run the same tfring build");
}

}  // namespace

std::string EncodeRequests(const std::vector<Request>& requests) {
  ByteWriter writer;
  writer.Put<int64_t>(static_cast<int64_t>(requests.size()));
  for (const Request& request : requests) PutRequest(writer, request);
  return writer.Take();
}

Status DecodeRequests(const std::string& bytes, std::vector<Request>* requests) {
  ByteReader reader(bytes);
  int64_t count = 0;
  if (!reader.Get(&count) || count < 0) return Malformed("request");
  requests->resize(count);
  for (Request& request : *requests) {
    if (!GetRequest(reader, &request)) return Malformed("request");
  }
  return reader.AtEnd() ? Status::OK() : Malformed("request");
}

std::string EncodeResponses(const ResponseList& responses, const std::string& shutdown_reason) {
  ByteWriter writer;
  writer.PutString(shutdown_reason);
  writer.Put<int64_t>(static_cast<int64_t>(responses.size()));
  for (const Response& response : responses) {
    PutRequest(writer, response.request);
    writer.Put<int8_t>(response.is_error ? 1 : 0);
    writer.Put<int32_t>(response.contributors);
    writer.PutString(response.error_message);
  }
  return writer.Take();
}

Status DecodeResponses(const std::string& bytes, ResponseList* responses,
                       std::string* shutdown_reason) {
  ByteReader reader(bytes);
  int64_t count = 0;
  if (!reader.GetString(shutdown_reason) || !reader.Get(&count) || count < 0) {
    return Malformed("response");
  }
  responses->resize(count);
  for (Response& response : *responses) {
    int8_t is_error = 0;
    if (!GetRequest(reader, &response.request) || !reader.Get(&is_error) ||
        !reader.Get(&response.contributors) || !reader.GetString(&response.error_message)) {
      return Malformed("response");
    }
    response.is_error = is_error != 0;
  }
  return reader.AtEnd() ? Status::OK() : Malformed("response");
}

}  // namespace tfring
