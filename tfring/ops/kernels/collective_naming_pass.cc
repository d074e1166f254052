// A graph pass that makes the cross-rank names of collectives unique per
// top-level function, after TensorFlow has inlined the functions it calls.
//
// Why: the Python wrappers name each collective when it is traced, after
// the function that contains it and the user's name ("helper/grad_w", or
// "helper/allreduce.0" unnamed; see collective_ops.py). A @tf.function
// helper called from two functions f and g is traced once, and TensorFlow
// inlines the same body into both, so f and g would submit the same name:
// run concurrently, rank 0's f could be paired with rank 1's g, silently
// mixing their tensors. When TensorFlow prepares a function to run (every
// rank the same way), this pass prefixes each collective's name with the
// name of the function being run, stripped of TensorFlow's per-process
// counter ("f/helper/grad_w", "g/helper/grad_w"). The copies of one name
// that the function then holds (a helper called twice) are numbered
// "@0", "@1", ... in the natural order of their node names ("call_2" before
// "call_10"): inlined nodes are named after their call sites, which
// TensorFlow numbers in the order the calls were built, so copies built in
// the same order on every rank get the same numbers even when a name scope
// opened on one rank only shifts the node names. The node names themselves
// are never the key.
//
// Limits: functions compiled by XLA as a whole keep the traced names (this
// pass does not see their bodies), as do functions TensorFlow does not
// inline; two top-level functions with the same Python name running
// concurrently still share names, and the core reports the second one in
// flight.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "tensorflow/core/common_runtime/optimization_registry.h"
#include "tensorflow/core/framework/function.h"
#include "tensorflow/core/graph/graph.h"

namespace tfring {
namespace tf_ops {
namespace {

using tensorflow::GraphOptimizationPass;
using tensorflow::GraphOptimizationPassOptions;
using tensorflow::Node;

bool IsCollective(const Node* node) {
  const std::string& type = node->type_string();
  return type == "Tfring>Allreduce" || type == "Tfring>Allgather" ||
         type == "Tfring>Broadcast" || type == "Tfring>Alltoall" ||
         type == "Tfring>Reducescatter";
}

// "__inference_train_step_1234" -> "train_step",
// "__inference___backward_train_step_12_34" -> "backward_train_step": the
// name of the Python function (FuncGraph) the FunctionDef was traced from,
// normalised by the rule of _scope_for_graph_name in collective_ops.py.
// TensorFlow's trailing counters differ between ranks that traced different
// numbers of functions, so they are dropped.
std::string StableFunctionName(std::string name) {
  const std::string inference = "__inference_";
  if (absl::StartsWith(name, inference)) name = name.substr(inference.size());
  while (true) {  // trailing "_<digits>", repeatedly
    const size_t underscore = name.find_last_of('_');
    if (underscore == std::string::npos || underscore + 1 == name.size() ||
        name.find_first_not_of("0123456789", underscore + 1) != std::string::npos) {
      break;
    }
    name.resize(underscore);
  }
  for (char& c : name) {
    if (!absl::ascii_isalnum(c) && c != '_' && c != '.' && c != '-') c = '_';
  }
  const size_t start = name.find_first_of(
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.");
  name = start == std::string::npos ? "" : name.substr(start);
  return name.empty() ? "function" : name;
}

// Orders names with runs of digits compared as numbers ("call_2" before
// "call_10"), the order in which TensorFlow numbers uniquified names.
bool NaturalLess(const std::string& a, const std::string& b) {
  size_t i = 0;
  size_t j = 0;
  while (i < a.size() && j < b.size()) {
    if (absl::ascii_isdigit(a[i]) && absl::ascii_isdigit(b[j])) {
      const size_t a_end = std::min(a.find_first_not_of("0123456789", i), a.size());
      const size_t b_end = std::min(b.find_first_not_of("0123456789", j), b.size());
      // Leading zeros do not occur in TensorFlow's counters; skip them so
      // that equal numbers compare equal.
      size_t a_start = i;
      size_t b_start = j;
      while (a_start + 1 < a_end && a[a_start] == '0') ++a_start;
      while (b_start + 1 < b_end && b[b_start] == '0') ++b_start;
      const size_t a_digits = a_end - a_start;
      const size_t b_digits = b_end - b_start;
      if (a_digits != b_digits) return a_digits < b_digits;
      const int order = a.compare(a_start, a_digits, b, b_start, b_digits);
      if (order != 0) return order < 0;
      if (a_end - i != b_end - j) return a_end - i < b_end - j;
      i = a_end;
      j = b_end;
      continue;
    }
    if (a[i] != b[j]) return a[i] < b[j];
    ++i;
    ++j;
  }
  return a.size() - i < b.size() - j;
}

class CollectiveNamingPass : public GraphOptimizationPass {
 public:
  absl::Status Run(const GraphOptimizationPassOptions& options) override {
    if (!options.is_function_graph || options.graph == nullptr ||
        options.function_def == nullptr) {
      return absl::OkStatus();
    }
    // An eager op that TensorFlow runs as a one-op function keeps the
    // eager naming rule (its `name=`).
    if (absl::StartsWith(options.function_def->signature().name(), "__wrapped__")) {
      return absl::OkStatus();
    }
    std::vector<Node*> collectives;
    for (Node* node : (*options.graph)->op_nodes()) {
      if (IsCollective(node)) collectives.push_back(node);
    }
    if (collectives.empty()) return absl::OkStatus();
    const std::string function =
        StableFunctionName(options.function_def->signature().name());

    // Key every collective by its function-qualified name, in node-name
    // order so that copies of one name are numbered the same on every rank.
    std::sort(collectives.begin(), collectives.end(), [](const Node* a, const Node* b) {
      return NaturalLess(a->name(), b->name());
    });
    std::map<std::string, std::vector<Node*>> by_name;
    for (Node* node : collectives) {
      std::string name;
      TF_RETURN_IF_ERROR(tensorflow::GetNodeAttr(node->attrs(), "tensor_name", &name));
      if (name.empty()) name = node->name();
      if (!absl::StartsWith(name, function + "/")) name = function + "/" + name;
      by_name[name].push_back(node);
    }
    for (auto& [name, nodes] : by_name) {
      for (size_t copy = 0; copy < nodes.size(); ++copy) {
        const std::string unique =
            nodes.size() == 1 ? name : name + "@" + std::to_string(copy);
        nodes[copy]->ClearAttr("tensor_name");
        nodes[copy]->AddAttr("tensor_name", unique);
      }
    }
    return absl::OkStatus();
  }
};

// After placement and TensorFlow's own rewrites, by which time the function
// calls in the graph have been inlined.
REGISTER_OPTIMIZATION(tensorflow::OptimizationPassRegistry::POST_REWRITE_FOR_EXEC, 0,
                      CollectiveNamingPass);

}  // namespace
}  // namespace tf_ops
}  // namespace tfring
