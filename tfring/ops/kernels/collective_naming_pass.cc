// A graph pass that makes the cross-rank names of collectives unique per
// top-level function, after TensorFlow has inlined the functions it calls.
//
// Why: the Python wrappers name each collective when it is traced, after
// the function that contains it and its position there
// ("helper/allreduce.0"; see collective_ops.py). A @tf.function helper
// called from two functions f and g is traced once, and TensorFlow inlines
// the same body into both, so f and g would submit the same name: run
// concurrently, rank 0's f could be paired with rank 1's g, silently mixing
// their tensors. When TensorFlow prepares a function to run (every rank the
// same way), this pass prefixes each collective's name with the name of the
// function being run, stripped of TensorFlow's per-process counter
// ("f/helper/allreduce.0", "g/helper/allreduce.0"), and numbers the copies
// of one name that the function holds (a helper called twice) in node-name
// order. The node names themselves are never the key: a name scope opened
// on one rank only shifts them.
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
    std::sort(collectives.begin(), collectives.end(),
              [](const Node* a, const Node* b) { return a->name() < b->name(); });
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
