// tfring._core: the Python binding of the core's control API (init,
// shutdown, process sets, topology, configuration) and of the enums shared
// with C++.
//
// No logic lives here. TensorFlow's collectives go through the op library;
// other frameworks' (tfring.torch) hand host buffers to the core through
// buffer_collectives_binding.h, bound here too. Core Status errors become exceptions at
// this boundary, the only place they are thrown: InvalidArgument (a bad
// argument, e.g. process sets that differ between ranks) as ValueError,
// everything else as RuntimeError. Calls that wait for the other ranks
// release the GIL, so the process's other Python threads keep running.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cc/api.h"
#include "cc/common.h"
#include "cc/config.h"
#include "tfring/binding/buffer_collectives_binding.h"

namespace py = pybind11;

namespace {

void ThrowIfError(const tfring::Status& status) {
  if (status.ok()) return;
  if (status.code() == tfring::StatusCode::kInvalidArgument) {
    throw py::value_error(status.message());
  }
  throw std::runtime_error(status.message());
}

tfring::Topology RequireTopology() {
  if (!tfring::IsInitialized()) {
    throw std::runtime_error(
        "tfring has not been initialized; call tfring.init() before asking for the topology.");
  }
  return tfring::GetTopology();
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "Control API of tfring's C++ core (internal; use the tfring package).";

  py::enum_<tfring::ReduceOp>(m, "ReduceOp", "Reduction ops; values match horovod.tensorflow.")
      .value("Average", tfring::ReduceOp::kAverage)
      .value("Sum", tfring::ReduceOp::kSum)
      .value("Adasum", tfring::ReduceOp::kAdasum)
      .value("Min", tfring::ReduceOp::kMin)
      .value("Max", tfring::ReduceOp::kMax)
      .value("Product", tfring::ReduceOp::kProduct);

  py::enum_<tfring::WireCompression>(
      m, "WireCompression",
      "How float32 Sum/Average allreduces are encoded where they cross hosts.")
      .value("none", tfring::WireCompression::kNone)
      .value("bf16", tfring::WireCompression::kBf16)
      .value("fp16", tfring::WireCompression::kFp16);

  py::enum_<tfring::DataType>(m, "DataType")
      .value("uint8", tfring::DataType::kUInt8)
      .value("int8", tfring::DataType::kInt8)
      .value("uint16", tfring::DataType::kUInt16)
      .value("int16", tfring::DataType::kInt16)
      .value("int32", tfring::DataType::kInt32)
      .value("int64", tfring::DataType::kInt64)
      .value("float16", tfring::DataType::kFloat16)
      .value("bfloat16", tfring::DataType::kBFloat16)
      .value("float32", tfring::DataType::kFloat32)
      .value("float64", tfring::DataType::kFloat64)
      .value("bool", tfring::DataType::kBool);

  m.def("reducible", &tfring::IsReducible,
        "Whether allreduce supports the dtype (allgather and broadcast support all).");

  m.def(
      "init",
      [](int64_t comm_fortran_handle, const std::vector<std::vector<int>>& process_sets,
         bool dynamic_process_sets) {
        tfring::Status status;
        {
          py::gil_scoped_release release;
          status = tfring::InitializeMpi(comm_fortran_handle, process_sets,
                                         dynamic_process_sets);
        }
        ThrowIfError(status);
      },
      py::arg("comm_fortran_handle"), py::arg("process_sets") = std::vector<std::vector<int>>(),
      py::arg("dynamic_process_sets") = false,
      "Starts the core over a duplicate of the MPI communicator (mpi4py comm.py2f()), with "
      "the given process sets (sorted job ranks; ids 1, 2, ... in order) besides the global "
      "one, and whether sets may be added and removed later.");
  m.def(
      "add_process_set",
      [](const std::vector<int>& ranks) {
        tfring::Status status;
        int32_t id = -1;
        {
          py::gil_scoped_release release;
          status = tfring::AddProcessSet(ranks, &id);
        }
        ThrowIfError(status);
        return id;
      },
      py::arg("ranks"),
      "Adds a process set of these sorted job ranks; collective over every rank. Returns its "
      "id.");
  m.def(
      "remove_process_set",
      [](int32_t id) {
        tfring::Status status;
        {
          py::gil_scoped_release release;
          status = tfring::RemoveProcessSet(id);
        }
        ThrowIfError(status);
      },
      py::arg("process_set_id"), "Removes a process set; collective over every rank.");
  m.def(
      "process_sets", [] { return tfring::ProcessSets(); },
      "The process sets that exist now: {id: sorted job ranks}, 0 the global set; empty "
      "while not initialized.");
  m.def(
      "shutdown",
      [] {
        tfring::Status status;
        {
          py::gil_scoped_release release;
          status = tfring::Shutdown();
        }
        ThrowIfError(status);
      },
      "Stops the background thread in step with the other ranks.");
  m.def(
      "start_timeline",
      [](const std::string& path, bool mark_cycles) {
        ThrowIfError(tfring::StartTimeline(path, mark_cycles));
      },
      py::arg("path"), py::arg("mark_cycles") = false,
      "Rank 0 starts writing the timeline to `path` (other ranks: no-op).");
  m.def(
      "stop_timeline",
      [] {
        tfring::Status status;
        {
          py::gil_scoped_release release;  // waits for the writer thread
          status = tfring::StopTimeline();
        }
        ThrowIfError(status);
      },
      "Closes the timeline file.");
  m.def("is_initialized", &tfring::IsInitialized);
  m.def("stopped_by_failure", &tfring::StoppedByFailure,
        "Whether a dead peer or a transport failure stopped the core (not a shutdown).");
  m.def("set_elastic_mode", &tfring::SetElasticMode, py::arg("elastic"),
        "Elastic training: a failure leaves the timeline open (before init).");
  m.def(
      "shutdown_for_reset",
      [] {
        tfring::Status status;
        {
          py::gil_scoped_release release;  // joins the background thread
          status = tfring::ShutdownForReset();
        }
        ThrowIfError(status);
      },
      "Stops the core like shutdown(), leaving the timeline open.");
  m.def("revoke_job", &tfring::RevokeJob,
        "Elastic: revokes the job's communicator so every rank's core stops as after a failure.");
  m.def("mark_timeline", &tfring::MarkTimeline, py::arg("name"), py::arg("detail"),
        "Rank 0: an instant event on the timeline's cycles row (when recording).");
  m.def("mpi_threads_supported", &tfring::MpiThreadsSupported);
  m.def("shm_enabled", &tfring::SharedMemoryEnabled);
  m.def(
      "data_path",
      [] {
        switch (tfring::CurrentDataPath()) {
          case tfring::DataPath::kSharedMemory:
            return "shared_memory";
          case tfring::DataPath::kHierarchical:
            return "hierarchical";
          case tfring::DataPath::kMpi:
            break;
        }
        return "mpi";
      },
      "How the global set's allreduces move data: 'shared_memory', 'hierarchical' or 'mpi'.");
  m.def("rank", [] { return RequireTopology().rank; });
  m.def("size", [] { return RequireTopology().size; });
  m.def("local_rank", [] { return RequireTopology().local_rank; });
  m.def("local_size", [] { return RequireTopology().local_size; });
  m.def("cross_rank", [] { return RequireTopology().cross_rank; });
  m.def("cross_size", [] { return RequireTopology().cross_size; });
  m.def("core_state_address",
        [] { return reinterpret_cast<uintptr_t>(tfring::CoreStateAddress()); },
        "Address of the process-wide core state (tests check it is shared).");
  m.def(
      "config",
      [] {
        py::list entries;
        for (const tfring::ConfigEntry& entry : tfring::DescribeConfig(tfring::EffectiveConfig())) {
          py::dict item;
          item["env"] = entry.env_name;
          item["type"] = entry.type;
          item["value"] = entry.value;
          item["default"] = entry.default_value;
          item["maximum"] = entry.maximum;
          item["doc"] = entry.doc;
          item["scope"] = entry.scope == tfring::KnobScope::kJob ? "job" : "process";
          item["set_by"] = entry.set_by;
          item["horovod"] = entry.horovod_names;
          entries.append(item);
        }
        return entries;
      },
      "The effective TFRING_* configuration: env, type (integer, number, text), value, default, maximum (\"\" for strings), "
      "doc, scope, set_by (the variable the value was read from: the TFRING_* one, a HOROVOD_* "
      "one, or \"\" when none was set) and horovod (Horovod's names for the knob) for each knob (while "
      "initialized, the job-wide knobs hold rank 0's values).");
  m.def(
      "horovod_variables",
      [] {
        py::list variables;
        for (const tfring::HorovodVariable& variable : tfring::HorovodVariables()) {
          const char* meaning = "";
          switch (variable.meaning) {
            case tfring::HorovodMeaning::kSame: meaning = "same"; break;
            case tfring::HorovodMeaning::kSwitch: meaning = "switch"; break;
            case tfring::HorovodMeaning::kDisables: meaning = "disables"; break;
            case tfring::HorovodMeaning::kTimelinePath: meaning = "timeline"; break;
            case tfring::HorovodMeaning::kLogLevel: meaning = "log_level"; break;
            case tfring::HorovodMeaning::kReadByPython: meaning = "python"; break;
            case tfring::HorovodMeaning::kAlreadySo: meaning = "already_so"; break;
            case tfring::HorovodMeaning::kIgnored: meaning = "ignored"; break;
            case tfring::HorovodMeaning::kBuildTime: meaning = "build_time"; break;
          }
          py::dict item;
          item["name"] = variable.name;
          item["knob"] = variable.knob;
          item["meaning"] = meaning;
          item["note"] = variable.note;
          variables.append(item);
        }
        return variables;
      },
      "Every HOROVOD_* variable tfring knows: name (a trailing * stands for a family), knob (the "
      "TFRING_* variable it sets, or \"\"), meaning (same, switch, disables, timeline, "
      "log_level: read as that knob; python: read by tfring.init(); already_so: tfring always "
      "behaves so; ignored; build_time) and note.");
  tfring::buffer_collectives::BindBufferCollectives(m);
}
