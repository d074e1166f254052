"""The timeline: rank 0's Chrome trace-event file of every collective.

Checks the file against docs/timeline.md at 1, 2 and 3 ranks: valid JSON
once stopped, one row per tensor, every rank's readiness (a rank made late
on purpose is named as the one the others waited for), the op span with its
arguments and nested phases, fused batches sharing their phases, cycle
marks, restarting, and the errors.
"""
import json
import os
import tempfile
import time

import pytest
import tensorflow as tf

import tfring

# Rank r submits the checked tensor r * LATE_STEP_S after rank 0.
LATE_STEP_S = 0.08
GROUP_ATTEMPTS = 10


def _shared_directory():
    """A fresh directory, the same path on every rank (one host)."""
    path = tempfile.mkdtemp(prefix="tfring_timeline_") if tfring.rank() == 0 else None
    return tfring.broadcast_object(path, root_rank=0, name="timeline_directory")


def _settle(name):
    """One collective, so every rank has answered at least one round since
    the timeline started (readiness reports start with the next round)."""
    tfring.allreduce(tf.constant([1.0]), name=name)


def _load(path):
    with open(path) as f:
        return json.load(f)


def _rows(trace):
    """{tensor name: [events of its row]}."""
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e.get("ph") == "M" and e["name"] == "process_name"}
    rows = {}
    for event in trace["traceEvents"]:
        if event.get("ph") != "M":
            rows.setdefault(names[event["pid"]], []).append(event)
    return rows


def _one(events, **match):
    found = [e for e in events if all(e.get(k) == v for k, v in match.items())]
    assert len(found) == 1, (match, events)
    return found[0]


def _check_phases_nested(row, op_span):
    phases = [e for e in row if e.get("cat") == "phase"]
    order = ["queue", "copy_in", "communicate", "copy_out", "callback"]
    names = [p["name"] for p in phases]
    assert names == sorted(names, key=order.index), names
    assert "communicate" in names and "callback" in names, names
    start, end = op_span["ts"], op_span["ts"] + op_span["dur"]
    previous_end = start
    for phase in phases:
        assert phase["args"]["batch"] == op_span["args"]["batch"]
        assert phase["ts"] >= previous_end - 0.01, (phase, previous_end)
        previous_end = phase["ts"] + phase["dur"]
        assert previous_end <= end + 0.01, (phase, op_span)


def test_timeline_records_readiness_ops_and_phases():
    directory = _shared_directory()
    path = os.path.join(directory, "timeline.json")
    tfring.start_timeline(path)
    _settle("timeline_settle")

    time.sleep(LATE_STEP_S * tfring.rank())
    late = tfring.allreduce(tf.fill([10], 1.0), op=tfring.Sum, name="timeline_late")
    assert float(late[0]) == tfring.size()
    # Fusion depends on the tensors reaching the background thread in the
    # same round: a few groups give it the chance.
    small = [tf.fill([5 + i], float(i)) for i in range(3)]
    for attempt in range(GROUP_ATTEMPTS):
        tfring.grouped_allreduce(small, name=f"timeline_group{attempt}")
    tfring.allgather(tf.ones([tfring.rank() + 1, 2]), name="timeline_gather")
    tfring.broadcast(tf.zeros([4], tf.int32), root_rank=tfring.size() - 1,
                     name="timeline_broadcast")
    tfring.stop_timeline()
    if tfring.rank() != 0:
        assert not os.path.exists(path) or os.path.getsize(path) >= 0
        _settle("timeline_done")
        return

    trace = _load(path)
    assert trace["otherData"]["size"] == tfring.size()
    assert trace["otherData"]["dropped_events"] == 0
    rows = _rows(trace)
    size = tfring.size()

    row = rows["timeline_late"]
    negotiate = _one(row, name="negotiate")
    assert negotiate["args"]["op"] == "allreduce"
    marks = {e["args"]["rank"]: e["ts"] for e in row if e["name"] == "ready"}
    assert sorted(marks) == list(range(size)), marks
    for ts in marks.values():
        assert negotiate["ts"] - 0.01 <= ts <= negotiate["ts"] + negotiate["dur"] + 0.01
    if size > 1:
        assert negotiate["args"]["last_ready_rank"] == size - 1
        lateness_us = marks[size - 1] - marks[0]
        assert lateness_us >= 0.6 * LATE_STEP_S * (size - 1) * 1e6, marks
    op = _one(row, name="allreduce")
    assert op["cat"] == "op"
    assert op["ts"] == pytest.approx(negotiate["ts"] + negotiate["dur"], abs=0.01)
    args = op["args"]
    assert (args["dtype"], args["shape"], args["bytes"]) == ("float32", [10], 40)
    assert args["process_set"] == 0 and "error" not in args
    _check_phases_nested(row, op)

    # A fused batch: its members' op spans agree, and they share its phases.
    # (Each group's first eager call also exchanges the list's length:
    # rows named <group>.list_length, not part of the batch.)
    ops = [_one(rows[name], cat="op") for name in rows
           if "timeline_group" in name and not name.endswith(".list_length")]
    assert len(ops) == 3 * GROUP_ATTEMPTS
    by_batch = {}
    for o in ops:
        by_batch.setdefault(o["args"]["batch"], []).append(o)
    fused = [batch for batch in by_batch.values() if len(batch) > 1]
    print(f"{len(fused)} of {GROUP_ATTEMPTS} groups fused")
    assert fused, "no group of three small tensors was fused in any attempt"
    for batch in by_batch.values():
        for o in batch:
            assert o["args"]["batch_tensors"] == len(batch)
            if len(batch) > 1:
                assert o["args"]["fused"] is True
            assert o["args"]["batch_bytes"] == sum(m["args"]["bytes"] for m in batch)
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e.get("ph") == "M" and e["name"] == "process_name"}
    members = [names[o["pid"]] for o in fused[0]]
    # One collective for the batch (packed into the fusion buffer over MPI,
    # reduced from the members' own buffers on shared memory).
    communicates = [_one(rows[name], name="communicate") for name in members]
    assert len({(c["ts"], c["dur"]) for c in communicates}) == 1

    gather = _one(rows["timeline_gather"], cat="op")
    assert gather["name"] == "allgather" and gather["args"]["shape"] == [1, 2]
    broadcast = _one(rows["timeline_broadcast"], cat="op")
    assert broadcast["name"] == "broadcast"
    assert broadcast["args"]["dtype"] == "int32"
    assert not [e for e in trace["traceEvents"] if e.get("cat") == "cycle"]
    _settle("timeline_done")


def test_mark_cycles_restart_and_stop_twice():
    directory = _shared_directory()
    first = os.path.join(directory, "first.json")
    second = os.path.join(directory, "second.json")
    tfring.start_timeline(first, mark_cycles=True)
    _settle("cycles_settle")
    tfring.allreduce(tf.ones([3]), name="cycles_tensor")
    # Starting again closes the first file and records into the second.
    tfring.start_timeline(second)
    _settle("cycles_second")
    tfring.stop_timeline()
    tfring.stop_timeline()  # nothing records: a no-op
    if tfring.rank() == 0:
        trace = _load(first)
        cycles = [e for e in trace["traceEvents"] if e.get("cat") == "cycle"]
        assert cycles and all(e["pid"] == 0 for e in cycles)
        ops = [e for e in trace["traceEvents"] if e.get("cat") == "op"]
        for o in ops:
            assert any(c["args"]["cycle"] == o["args"]["cycle"] for c in cycles), o
        assert "cycles_tensor" in _rows(trace)
        later = _rows(_load(second))
        assert "cycles_second" in later and "cycles_tensor" not in later
    _settle("cycles_done")


def test_start_timeline_reports_an_unwritable_path():
    path = "/nonexistent_tfring_directory/timeline.json"
    if tfring.rank() == 0:
        with pytest.raises(ValueError) as raised:
            tfring.start_timeline(path)
        message = str(raised.value)
        assert path in message and "No such file or directory" in message
        assert "writable directory" in message
    else:
        tfring.start_timeline(path)  # only rank 0 writes: nothing to check here
    # The job goes on without a timeline.
    total = tfring.allreduce(tf.ones([2]), op=tfring.Sum, name="after_bad_timeline")
    assert float(total[0]) == tfring.size()
