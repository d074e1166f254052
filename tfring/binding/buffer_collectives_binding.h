// The pybind11 face of buffer_collectives.h, part of tfring._core.
//
// Why separate from the control API: this is the one place tensor data
// (addresses of it) enters the core from Python. Python passes addresses and
// sizes it has checked (contiguous host memory of a supported dtype) and
// keeps the tensors alive until the handle completes; waiting releases the
// GIL, so the background thread's callback and the process's other Python
// threads never wait for the caller.
#ifndef TFRING_TFRING_BINDING_BUFFER_COLLECTIVES_BINDING_H_
#define TFRING_TFRING_BINDING_BUFFER_COLLECTIVES_BINDING_H_

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cc/common.h"
#include "cc/status.h"
#include "tfring/binding/buffer_collectives.h"

namespace tfring {
namespace buffer_collectives {

inline void BindBufferCollectives(pybind11::module_& m) {
  namespace py = pybind11;

  py::enum_<StatusCode>(m, "StatusCode", "The core's error codes.")
      .value("OK", StatusCode::kOk)
      .value("InvalidArgument", StatusCode::kInvalidArgument)
      .value("FailedPrecondition", StatusCode::kFailedPrecondition)
      .value("Aborted", StatusCode::kAborted)
      .value("Internal", StatusCode::kInternal)
      .value("ResourceExhausted", StatusCode::kResourceExhausted);

  py::enum_<CollectiveType>(m, "CollectiveType")
      .value("allreduce", CollectiveType::kAllreduce)
      .value("allgather", CollectiveType::kAllgather)
      .value("broadcast", CollectiveType::kBroadcast)
      .value("alltoall", CollectiveType::kAlltoall)
      .value("reducescatter", CollectiveType::kReducescatter)
      .value("join", CollectiveType::kJoin);

  m.attr("JOIN_TENSOR_NAME") = kJoinTensorName;
  m.def("data_type_size", &DataTypeSize, py::arg("dtype"), "Bytes per element.");

  m.def(
      "advise_huge_pages",
      [](uintptr_t address, size_t bytes) { AdviseHugePages(reinterpret_cast<void*>(address), bytes); },
      py::arg("address"), py::arg("bytes"),
      "Asks for transparent huge pages under fresh memory [address, address + bytes) before it "
      "is first written (a hint; never fails).");

  py::class_<HostBuffer, std::shared_ptr<HostBuffer>>(
      m, "HostBuffer", py::buffer_protocol(),
      "Memory the core allocated for a collective's output: bytes, viewable without a copy "
      "(buffer protocol); large ones on transparent huge pages.")
      .def_buffer([](HostBuffer& buffer) {
        return py::buffer_info(buffer.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(buffer.bytes())}, {1});
      })
      .def("__len__", &HostBuffer::bytes);

  py::class_<PendingCollective, std::shared_ptr<PendingCollective>>(
      m, "PendingCollective", "A collective handed to the core; poll done() or wait().")
      .def("done", &PendingCollective::Done,
           "Whether the collective has completed (wait() would not block).")
      .def(
          "wait",
          [](const PendingCollective& pending) {
            Status status;
            {
              py::gil_scoped_release release;
              status = pending.Wait();
            }
            return py::make_tuple(status.code(), status.message());
          },
          "Blocks (without the GIL) until the collective completes; returns (StatusCode, "
          "message).")
      .def("output", &PendingCollective::output,
           "The output the core allocated (allgather, alltoall, reducescatter), else None.")
      .def("output_shape", &PendingCollective::output_shape)
      .def("received_splits", &PendingCollective::received_splits,
           "Alltoall: the rows received from each rank of the set.");

  m.def(
      "enqueue",
      [](CollectiveType type, std::string name, DataType dtype, std::vector<int64_t> shape,
         uintptr_t input, uintptr_t output, ReduceOp reduce_op, double prescale_factor,
         double postscale_factor, int32_t root_rank, int32_t process_set_id,
         std::vector<int64_t> splits, int64_t group_key, int32_t group_size,
         WireCompression compression) {
        BufferCollective collective;
        collective.request.name = std::move(name);
        collective.request.type = type;
        collective.request.dtype = dtype;
        collective.request.shape = std::move(shape);
        collective.request.reduce_op = reduce_op;
        collective.request.prescale_factor = prescale_factor;
        collective.request.postscale_factor = postscale_factor;
        collective.request.root_rank = root_rank;
        collective.request.process_set_id = process_set_id;
        collective.request.compression = compression;
        collective.input = input;
        collective.output = output;
        collective.splits = std::move(splits);
        collective.group.key = group_key;
        collective.group.size = group_size;
        std::shared_ptr<PendingCollective> pending;
        const Status status = EnqueueBufferCollective(std::move(collective), &pending);
        if (status.code() == StatusCode::kInvalidArgument) {
          throw py::value_error(status.message());
        }
        if (!status.ok()) throw std::runtime_error(status.message());
        return pending;
      },
      py::arg("type"), py::arg("name"), py::arg("dtype"), py::arg("shape"), py::arg("input"),
      py::arg("output") = 0, py::arg("reduce_op") = ReduceOp::kSum,
      py::arg("prescale_factor") = 1.0, py::arg("postscale_factor") = 1.0,
      py::arg("root_rank") = 0, py::arg("process_set_id") = 0,
      py::arg("splits") = std::vector<int64_t>(), py::arg("group_key") = 0,
      py::arg("group_size") = 1, py::arg("compression") = WireCompression::kNone,
      "Hands a collective on host memory to the core: `input` (and `output` for allreduce, "
      "broadcast and join) are addresses of contiguous buffers of NumElements(shape) "
      "elements of dtype, which the caller keeps alive until the returned handle completes. "
      "Raises ValueError/RuntimeError when the core refuses it (then nothing runs).");
}

}  // namespace buffer_collectives
}  // namespace tfring

#endif  // TFRING_TFRING_BINDING_BUFFER_COLLECTIVES_BINDING_H_
