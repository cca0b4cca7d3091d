// The C ABI: pushes and pulls from and to device (CUDA) memory, staged
// through a pool of DeviceIos per client (cc/client/device_io.h).
#include <functional>
#include <optional>

#include "cc/capi/internal.h"
#include "cc/core/status_macros.h"

using pserver_capi::Alive;
using pserver_capi::CallOf;
using pserver_capi::CheckDtype;
using pserver_capi::ParamName;
using pserver_capi::Run;

namespace {

// Runs `fn` with an idle DeviceIo of `device` from the client's pool (a new
// one if none is idle: UNAVAILABLE without a device), and puts it back.
absl::Status WithDeviceIo(pserver_client_t* client, int32_t device,
                          const std::function<absl::Status(pserver::DeviceIo&)>& fn) {
  std::unique_ptr<pserver::DeviceIo> io;
  {
    absl::MutexLock lock(&client->device_io.mu);
    auto& idle = client->device_io.idle;
    for (auto it = idle.begin(); it != idle.end(); ++it) {
      if (it->first == device) {
        io = std::move(it->second);
        idle.erase(it);
        break;
      }
    }
  }
  if (io == nullptr) {
    PS_ASSIGN_OR_RETURN(io, pserver::DeviceIo::ForCuda(client->rep.get(), device));
  }
  absl::Status status = fn(*io);
  absl::MutexLock lock(&client->device_io.mu);
  client->device_io.idle.emplace_back(device, std::move(io));
  return status;
}

using DevicePushFn = std::function<absl::Status(pserver::DeviceIo&, const std::string& name,
                                                const pserver::Shape& shape)>;

// Checks a device push of `size` bytes of `dtype` for parameter `name` and
// runs `fn` with its name, the gradient's shape and an idle DeviceIo.
absl::Status DevicePush(pserver_client_t* client, const char* name, size_t name_len, int32_t dtype,
                        size_t size, int32_t device, const DevicePushFn& fn) {
  PS_RETURN_IF_ERROR(Alive(client));
  PS_ASSIGN_OR_RETURN(std::string n, ParamName(name, name_len));
  PS_ASSIGN_OR_RETURN(pserver::Shape shape,
                      pserver_capi::GradientShape(*client->rep, n, dtype, size));
  return WithDeviceIo(client, device, [&](pserver::DeviceIo& io) { return fn(io, n, shape); });
}

}  // namespace

extern "C" {

void pserver_client_send_grad_device(pserver_client_t* client, const char* name, size_t name_len,
                                     int32_t dtype, const void* device_data, size_t size,
                                     int32_t device, pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  Run(status, [&]() -> absl::Status {
    return DevicePush(
        client, name, name_len, dtype, size, device,
        [&](pserver::DeviceIo& io, const std::string& n, const pserver::Shape& shape) {
          return io.SendGrad(n, static_cast<pserver::ElementType>(dtype), shape, device_data, call);
        });
  });
}

void pserver_client_get_param_device(pserver_client_t* client, const char* name, size_t name_len,
                                     int32_t dtype, void* device_out, size_t out_size,
                                     int32_t device, pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(Alive(client));
    PS_ASSIGN_OR_RETURN(std::string n, ParamName(name, name_len));
    PS_RETURN_IF_ERROR(CheckDtype(dtype));
    if (std::optional<pserver::ParamLayout> layout = client->rep->KnownLayout(n)) {
      PS_RETURN_IF_ERROR(pserver_capi::CheckBuffer(pserver_capi::ParamWhat(n), layout->type,
                                                   layout->shape, dtype, out_size));
    }
    return WithDeviceIo(client, device, [&](pserver::DeviceIo& io) {
      return io.GetParam(n, device_out, out_size, static_cast<pserver::ElementType>(dtype), call);
    });
  });
}

void pserver_client_push_pull_device(pserver_client_t* client, const char* name, size_t name_len,
                                     int32_t dtype, const void* device_data, void* device_out,
                                     size_t size, int32_t device, pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  Run(status, [&]() -> absl::Status {
    return DevicePush(
        client, name, name_len, dtype, size, device,
        [&](pserver::DeviceIo& io, const std::string& n, const pserver::Shape& shape) {
          return io.PushPull(n, static_cast<pserver::ElementType>(dtype), shape, device_data,
                             device_out, call);
        });
  });
}

}  // extern "C"
