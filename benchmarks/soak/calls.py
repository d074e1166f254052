"""Running the soak's plan against tfring: one API call per plan call, eager
or inside a tf.function program, on the main thread or on worker threads.

Why the lanes: tfring must accept the same collectives submitted in a
different order on every rank. Eagerly a call returns only when every rank
made it, so one thread can only submit in plan order (the main lane); the
thread lane starts each item on a worker thread of its own, in an order
permuted per rank and step, with a short random delay. Inside a program
every rank builds the collectives in the same order (tfring names graph
collectives by position), and a chain of control dependencies, permuted per
rank, releases their inputs in a different order on every rank.
"""

import concurrent.futures
import threading
import time

import tensorflow as tf

import tfring as hvd

from soak import plan

_OPS = {name: getattr(hvd, name) for name in plan.REDUCE_OPS}


def issue(template, tensors, splits, roots):
    """Makes the tfring API call `template` on `tensors` (one per member).

    `splits` and `roots` hold, per member, the alltoall splits (None: split
    evenly) and the broadcast root. Returns, per member, the list of its
    outputs (two for an alltoall with splits: the tensor and the splits
    received, as tfring returns them).
    """
    api, name = template.api, template.name
    first = template.members[0]
    reduce_args = {}
    if first.op is not None:
        reduce_args = dict(op=_OPS[first.op], prescale_factor=first.prescale,
                           postscale_factor=first.postscale)
    if api == "allreduce":
        return [[hvd.allreduce(tensors[0], name=name, **reduce_args)]]
    if api == "grouped_allreduce":
        return [[r] for r in hvd.grouped_allreduce(tensors, name=name,
                                                   **reduce_args)]
    if api == "reducescatter":
        return [[hvd.reducescatter(tensors[0], name=name, **reduce_args)]]
    if api == "grouped_reducescatter":
        return [[r] for r in hvd.grouped_reducescatter(tensors,
                                                       **reduce_args)]
    if api == "allgather":
        return [[hvd.allgather(tensors[0], name=name)]]
    if api == "grouped_allgather":
        return [[r] for r in hvd.grouped_allgather(tensors, name=name)]
    if api == "broadcast":
        return [[hvd.broadcast(tensors[0], root_rank=roots[0], name=name)]]
    if api == "alltoall":
        if splits[0] is None:
            return [[hvd.alltoall(tensors[0], name=name)]]
        return [list(hvd.alltoall(tensors[0], splits=splits[0], name=name))]
    raise ValueError(f"unknown API {api!r} in the soak's plan")


def _fresh(tensor):
    """A new tensor with `tensor`'s values that nothing else holds, as a
    gradient is (tfring may then reduce it in place)."""
    if tensor.dtype == tf.bool:
        return tf.identity(tensor)
    return tensor * tf.ones_like(tensor)


def build_program(template, program_index, seed, rank):
    """The tf.function of a ProgramTemplate, as `rank` runs it.

    It takes, per call, the list of member tensors, and a flat list of the
    alltoall splits (int32, one per member with splits, in order); it
    returns what issue() returns, per call.
    """
    sizes = [len(call.members) for call in template.calls]
    gate_order = plan.program_gate_order(seed, program_index, rank,
                                         sum(sizes))

    def body(inputs, splits):
        flat = [t for call_inputs in inputs for t in call_inputs]
        released = [None] * len(flat)
        previous = []
        for index in gate_order:
            with tf.control_dependencies(previous):
                released[index] = _fresh(flat[index])
            previous = [released[index]]
        outputs, offset, splits_left = [], 0, list(splits)
        for call, count in zip(template.calls, sizes):
            member_splits = [None if member.kind != "alltoall" or
                             member.even_split else splits_left.pop(0)
                             for member in call.members]
            outputs.append(issue(call, released[offset:offset + count],
                                 member_splits,
                                 [member.root for member in call.members]))
            offset += count
        return outputs

    # Graph collectives are named after the function (program_a/...).
    body.__name__ = template.name
    return tf.function(body, reduce_retracing=True, autograph=False)


class StepRunner:
    """Runs the items of one step on their lanes and tracks what is still
    pending (for the watchdog)."""

    def __init__(self, seed, rank, programs):
        self.seed = seed
        self.rank = rank
        self.programs = programs  # name -> tf.function
        self.pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=plan.MAX_THREAD_ITEMS,
            thread_name_prefix="soak-lane")
        self._lock = threading.Lock()
        self._pending = {}

    def pending(self):
        """Descriptions of the items started and not yet finished."""
        with self._lock:
            return sorted(self._pending.values())

    def _run_item(self, item, tensors, delay=0.0):
        """The outputs of `item` (per call, per member, a list of tensors),
        or the exception it raised."""
        if delay:
            time.sleep(delay)
        with self._lock:
            self._pending[item.index] = describe_item(item)
        try:
            if item.program is None:
                return [issue(call.template, call_tensors,
                              [None if u.splits is None else
                               list(u.splits[self.rank]) for u in call.uses],
                              [u.root for u in call.uses])
                        for call, call_tensors in zip(item.calls, tensors)]
            splits = [tf.constant(u.splits[self.rank], tf.int32)
                      for call in item.calls for u in call.uses
                      if u.splits is not None]
            return self.programs[item.program.name](tensors, splits)
        except Exception as error:  # noqa: BLE001 (reported, not hidden)
            return error
        finally:
            with self._lock:
                del self._pending[item.index]

    def run(self, step, inputs):
        """Runs every item of `step` (inputs[i]: item i's tensors, per call
        and member); returns the outputs per item, in item order."""
        thread_items = [i for i in step.items if i.lane == "thread"]
        order = plan.submission_order(self.seed, step.index, self.rank,
                                      len(thread_items))
        futures = {}
        for position in order:
            item = thread_items[position]
            delay = plan.jitter_seconds(self.seed, step.index, self.rank,
                                        item.index)
            futures[item.index] = self.pool.submit(
                self._run_item, item, inputs[item.index], delay)
        outputs = {}
        for item in step.items:
            if item.lane == "main":
                outputs[item.index] = self._run_item(item,
                                                     inputs[item.index])
        for index, future in futures.items():
            outputs[index] = future.result()
        return [outputs[item.index] for item in step.items]

    def close(self):
        self.pool.shutdown(wait=True)


def describe_call(template):
    dtypes = ",".join(m.dtype for m in template.members)
    op = f" {template.members[0].op}" if template.members[0].op else ""
    name = f" '{template.name}'" if template.name else " (unnamed)"
    return f"{template.api}{name} {dtypes}{op}"


def describe_item(item):
    where = (f"tf.function {item.program.name}" if item.program else
             "eager") + f", {item.lane} lane"
    return (f"item {item.index} ({where}): "
            + "; ".join(describe_call(c.template) for c in item.calls))
