"""tfring.timeline: the summary and plot tool for rank 0's timeline file (docs/timeline.md).

The timelines are built here, event by event as docs/timeline.md specifies,
with round numbers, so every number of the summary can be checked exactly.
The tool is loaded from its file with TensorFlow and the tfring package
blocked: it must work on a laptop copy of a timeline, and this keeps the file
fast. Only two tests run the real `python -m tfring.timeline`.
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL_PATH = os.path.join(REPO, "tfring", "timeline.py")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def tool():
    with pytest.MonkeyPatch.context() as patch:
        for blocked in ("tensorflow", "keras", "tfring"):
            patch.setitem(sys.modules, blocked, None)  # any import of them fails
        spec = importlib.util.spec_from_file_location("timeline_tool_under_test", TOOL_PATH)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module


class TimelineBuilder:
    """Emits events the way rank 0's writer does (docs/timeline.md)."""

    def __init__(self, size):
        self.size = size
        self.events = []
        self.pids = {}

    def pid(self, tensor):
        if tensor not in self.pids:
            pid = len(self.pids) + 1  # pid 0 is the row of cycle marks
            self.pids[tensor] = pid
            self.events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                                "args": {"name": tensor}})
            self.events.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
                                "args": {"sort_index": pid}})
        return self.pids[tensor]

    def cycle(self, ts, number):
        self.events.append({"name": "cycle", "ph": "i", "cat": "cycle", "ts": ts, "pid": 0,
                            "tid": 0, "s": "p", "args": {"cycle": number}})

    def negotiate(self, tensor, op, ready, agreed):
        """`ready`: {rank: ts of its ready mark}; the negotiation ends at `agreed`."""
        pid = self.pid(tensor)
        first = min(ready.values())
        last_rank = max(ready, key=ready.get)
        self.events.append({"name": "negotiate", "ph": "X", "cat": "negotiate", "ts": first,
                            "dur": agreed - first, "pid": pid, "tid": 0,
                            "args": {"op": op, "last_ready_rank": last_rank}})
        for rank, ts in sorted(ready.items()):
            self.events.append({"name": "ready", "ph": "i", "cat": "ready", "ts": ts, "pid": pid,
                                "tid": 0, "s": "t", "args": {"rank": rank}})

    def op(self, tensor, op, ts, dur, batch, cycle, nbytes, batch_tensors, batch_bytes,
           fused, error=None, process_set=0):
        args = {"dtype": "float32", "shape": [nbytes // 4], "bytes": nbytes, "batch": batch,
                "batch_tensors": batch_tensors, "batch_bytes": batch_bytes, "fused": fused,
                "cycle": cycle, "process_set": process_set}
        if error:
            args["error"] = error
        self.events.append({"name": op, "ph": "X", "cat": "op", "ts": ts, "dur": dur,
                            "pid": self.pid(tensor), "tid": 0, "args": args})

    def phases(self, members, batch, spans):
        """The batch's shared phase spans, repeated on every member's row."""
        for tensor in members:
            for name, ts, dur in spans:
                self.events.append({"name": name, "ph": "X", "cat": "phase", "ts": ts, "dur": dur,
                                    "pid": self.pid(tensor), "tid": 0, "args": {"batch": batch}})

    def event_lines(self):
        return [json.dumps(e) for e in self.events]

    def closing_line(self, dropped=0):
        return ('],"displayTimeUnit":"ms","otherData":{"tfring_timeline_version":1,'
                f'"size":{self.size},"dropped_events":{dropped}}}}}\n')

    def complete_text(self, dropped=0):
        return '{"traceEvents":[\n' + ",\n".join(self.event_lines()) + "\n" + self.closing_line(dropped)

    def write(self, path, dropped=0):
        path.write_text(self.complete_text(dropped))
        return str(path)


def fused_cycle(timeline):
    """Cycle 1: grad/a and grad/b fused into batch 1; grad/c (2-rank process set) alone in batch 2."""
    timeline.cycle(100, 1)
    timeline.negotiate("grad/a", "allreduce", {0: 100, 1: 130, 2: 160}, agreed=180)
    timeline.negotiate("grad/b", "allreduce", {1: 110, 0: 120, 2: 170}, agreed=180)
    timeline.op("grad/a", "allreduce", 180, 100, batch=1, cycle=1, nbytes=400,
                batch_tensors=2, batch_bytes=1000, fused=True)
    timeline.op("grad/b", "allreduce", 180, 100, batch=1, cycle=1, nbytes=600,
                batch_tensors=2, batch_bytes=1000, fused=True)
    timeline.phases(["grad/a", "grad/b"], 1, [("queue", 180, 5), ("copy_in", 185, 10),
                                              ("communicate", 195, 60), ("copy_out", 255, 15),
                                              ("callback", 270, 10)])
    timeline.negotiate("grad/c", "allgather", {0: 200, 1: 240}, agreed=250)
    timeline.op("grad/c", "allgather", 250, 30, batch=2, cycle=1, nbytes=64,
                batch_tensors=1, batch_bytes=64, fused=False, process_set=1)
    timeline.phases(["grad/c"], 2, [("communicate", 250, 20), ("callback", 270, 10)])


def three_cycles():
    timeline = TimelineBuilder(size=3)
    fused_cycle(timeline)
    # Cycle 2: grad/a and grad/b again, unfused; grad/b fails.
    timeline.cycle(1000, 2)
    timeline.negotiate("grad/a", "allreduce", {2: 1000, 0: 1010, 1: 1100}, agreed=1120)
    timeline.negotiate("grad/b", "allreduce", {0: 1005, 1: 1015, 2: 1020}, agreed=1120)
    timeline.op("grad/a", "allreduce", 1120, 70, batch=3, cycle=2, nbytes=400,
                batch_tensors=1, batch_bytes=400, fused=False)
    timeline.phases(["grad/a"], 3, [("copy_in", 1120, 5), ("communicate", 1125, 50),
                                    ("callback", 1175, 15)])
    timeline.op("grad/b", "allreduce", 1120, 10, batch=4, cycle=2, nbytes=600,
                batch_tensors=1, batch_bytes=600, fused=False,
                error="Mismatched allreduce tensor shapes")
    timeline.phases(["grad/b"], 4, [("callback", 1120, 10)])
    # Cycle 3: a broadcast.
    timeline.cycle(2000, 3)
    timeline.negotiate("bcast/w", "broadcast", {0: 2000, 1: 2005, 2: 2003}, agreed=2025)
    timeline.op("bcast/w", "broadcast", 2025, 40, batch=5, cycle=3, nbytes=128,
                batch_tensors=1, batch_bytes=128, fused=False)
    timeline.phases(["bcast/w"], 5, [("communicate", 2025, 30), ("callback", 2055, 10)])
    return timeline


EXPECTED_OPS = {
    "allreduce": {
        "tensors": 4, "bytes": 2000, "errors": 1, "total_us": 565,
        # waiting: 60 + 60 + 100 + 15; negotiation: 20 + 10 + 20 + 100
        "time_us": {"waiting_for_ranks": 235, "negotiation": 150, "queue": 5,
                    "copies": 10 + 15 + 5, "communication": 60 + 50, "callback": 10 + 15 + 10},
    },
    "allgather": {
        "tensors": 1, "bytes": 64, "errors": 0, "total_us": 80,
        "time_us": {"waiting_for_ranks": 40, "negotiation": 10, "queue": 0, "copies": 0,
                    "communication": 20, "callback": 10},
    },
    "broadcast": {
        "tensors": 1, "bytes": 128, "errors": 0, "total_us": 65,
        "time_us": {"waiting_for_ranks": 5, "negotiation": 20, "queue": 0, "copies": 0,
                    "communication": 30, "callback": 10},
    },
}


@pytest.fixture
def timeline_file(tmp_path):
    return three_cycles().write(tmp_path / "timeline.json")


def test_time_per_op_kind_and_phase(tool, timeline_file):
    summary = tool.summarize(tool.load(timeline_file))
    assert summary["ops"] == EXPECTED_OPS
    assert list(summary["ops"]) == ["allreduce", "allgather", "broadcast"]  # most time first
    assert summary["total_us"] == 565 + 80 + 65
    assert summary["cycle_marks"] == 3
    assert summary["source"] == {"path": timeline_file, "complete": True, "incomplete_reason": None,
                                 "skipped_lines": 0, "events": len(three_cycles().events),
                                 "ranks": 3, "dropped_events": 0}
    json.dumps(summary)  # plain data


def test_shared_phases_of_a_fused_batch_count_once(tool):
    timeline = TimelineBuilder(size=3)
    fused_cycle(timeline)
    times = tool.summarize(timeline.events)["ops"]["allreduce"]["time_us"]
    assert times == {"waiting_for_ranks": 60 + 60, "negotiation": 20 + 10, "queue": 5,
                     "copies": 25, "communication": 60, "callback": 10}


def test_waiting_runs_from_first_to_last_ready_mark_and_negotiation_from_there(tool):
    timeline = TimelineBuilder(size=2)
    timeline.negotiate("x", "allreduce", {1: 1000, 0: 1300}, agreed=1350)
    timeline.op("x", "allreduce", 1350, 50, batch=7, cycle=4, nbytes=8, batch_tensors=1,
                batch_bytes=8, fused=False)
    summary = tool.summarize(timeline.events)
    assert summary["ops"]["allreduce"]["time_us"]["waiting_for_ranks"] == 300
    assert summary["ops"]["allreduce"]["time_us"]["negotiation"] == 50
    assert summary["slowest"] == [{"name": "x", "op": "allreduce", "start_us": 1000,
                                   "total_us": 400, "last_ready_rank": 0, "late_by_us": 300,
                                   "error": None}]
    assert summary["source"]["complete"] is True  # a plain list counts as a complete file


def test_batches_per_cycle_and_batch_sizes(tool, timeline_file):
    batches = tool.summarize(tool.load(timeline_file))["batches"]
    assert batches == {
        "count": 5, "cycles": 3, "per_cycle_mean": 5 / 3, "per_cycle_max": 2,
        "tensors_per_batch": {"min": 1, "median": 1, "max": 2},
        "bytes_per_batch": {"min": 64, "median": 400, "max": 1000},
        "fused_fraction": 0.2,
    }


def test_slowest_tensors_name_the_late_rank(tool, timeline_file):
    summary = tool.summarize(tool.load(timeline_file), top=4)
    slowest = [(e["name"], e["op"], e["total_us"], e["last_ready_rank"], e["late_by_us"])
               for e in summary["slowest"]]
    assert slowest == [
        ("grad/a", "allreduce", 1190 - 1000, 1, 100),  # cycle 2: rank 1 late
        ("grad/a", "allreduce", 280 - 100, 2, 60),
        ("grad/b", "allreduce", 280 - 110, 2, 60),  # first ready was rank 1, not rank 0
        ("grad/b", "allreduce", 1130 - 1005, 2, 15),
    ]
    assert summary["slowest"][3]["error"] == "Mismatched allreduce tensor shapes"
    assert len(tool.summarize(tool.load(timeline_file), top=2)["slowest"]) == 2


def test_errors_are_counted_per_op_kind(tool, timeline_file):
    summary = tool.summarize(tool.load(timeline_file))
    assert {op: s["errors"] for op, s in summary["ops"].items()} == {
        "allreduce": 1, "allgather": 0, "broadcast": 0}
    assert summary["errors"] == [{"op": "allreduce", "message": "Mismatched allreduce tensor shapes",
                                  "count": 1}]


@pytest.mark.parametrize("separator", ["trailing", "leading"])
def test_truncated_file_keeps_its_complete_events(tool, tmp_path, separator):
    timeline = three_cycles()
    lines = timeline.event_lines()
    if separator == "trailing":
        body = "".join(line + ",\n" for line in lines)
    else:
        body = lines[0] + "\n" + "".join("," + line + "\n" for line in lines[1:])
    cut = body[:-(len(lines[-1]) // 2 + 2)]  # the job died while writing the last event
    path = tmp_path / "killed.json"
    path.write_text('{"traceEvents":[\n' + cut)

    events = tool.load(str(path))
    assert events.complete is False
    assert list(events) == timeline.events[:-1]
    summary = tool.summarize(events)
    assert summary["source"]["complete"] is False
    assert summary["source"]["skipped_lines"] == 1
    assert "no closing line" in summary["source"]["incomplete_reason"]
    assert "killed" in summary["source"]["incomplete_reason"]
    assert summary["ops"]["allreduce"]["tensors"] == 4
    text = tool.format_summary(summary)
    assert "WARNING: incomplete file: the file has no closing line" in text


def test_damaged_line_in_a_closed_file_is_skipped_and_reported(tool, tmp_path):
    timeline = three_cycles()
    lines = timeline.complete_text(dropped=2).splitlines(keepends=True)
    lines[5] = lines[5][:10] + "\n"
    path = tmp_path / "damaged.json"
    path.write_text("".join(lines))
    events = tool.load(str(path))
    assert len(events) == len(timeline.events) - 1
    summary = tool.summarize(events)
    assert summary["source"]["complete"] is False
    assert summary["source"]["skipped_lines"] == 1
    assert "closing line but some lines in it are not valid JSON" in summary["source"]["incomplete_reason"]
    assert summary["source"]["ranks"] == 3 and summary["source"]["dropped_events"] == 2


def test_file_with_only_its_first_line_is_an_empty_incomplete_timeline(tool, tmp_path):
    path = tmp_path / "early.json"
    path.write_text('{"traceEvents":[\n')
    summary = tool.summarize(tool.load(str(path)))
    assert summary["source"]["complete"] is False
    assert summary["ops"] == {}
    assert "No collective operations recorded." in tool.format_summary(summary)


def test_missing_file_is_an_os_error(tool, tmp_path):
    with pytest.raises(FileNotFoundError):
        tool.load(str(tmp_path / "nope.json"))


@pytest.mark.parametrize("content, found", [
    ("hello world\n", "a file starting with 'hello world"),
    ("", "an empty file"),
    ('[{"ph": "X"}]', "JSON of another shape (a list)"),
    ('{"foo": 1}', "JSON of another shape (a dict with keys ['foo'])"),
])
def test_not_a_timeline_is_a_clear_value_error(tool, tmp_path, content, found):
    path = tmp_path / "other.json"
    path.write_text(content)
    with pytest.raises(ValueError) as raised:
        tool.load(str(path))
    message = str(raised.value)
    assert f"{path} is not a tfring timeline" in message
    assert "TFRING_TIMELINE=" in message
    assert found in message


def test_format_summary_has_the_key_lines(tool, timeline_file):
    text = tool.format_summary(tool.summarize(tool.load(timeline_file), top=3))
    lines = text.splitlines()
    assert lines[0] == f"tfring timeline {timeline_file} (3 ranks, {len(three_cycles().events)} events)"
    assert "WARNING" not in text
    assert any(line.split() == ["allreduce", "4", "1.95", "KiB", "1"] for line in lines)
    # allreduce's waiting: 0.235 ms, 41.6% of its 0.565 ms, 33.1% of all 0.710 ms
    assert any(line.split() == ["allreduce", "waiting", "for", "ranks", "0.235", "41.6%", "33.1%"]
               for line in lines)
    assert any(line.split() == ["communication", "0.110", "19.5%", "15.5%"] for line in lines)
    assert any(line.split() == ["all", "ops", "total", "0.710", "100.0%"] for line in lines)
    assert "  5 batches in 3 cycles: 1.67 per cycle on average, at most 2" in lines
    assert "  tensors per batch: min 1, median 1, max 2" in lines
    assert "  bytes per batch:   min 64 B, median 400 B, max 1000 B" in lines
    assert "  fused (several tensors in one collective): 20.0% of batches" in lines
    assert any(line.split() == ["1.", "grad/a", "allreduce", "0.190", "rank", "1", "0.100"]
               for line in lines)
    assert not any(line.strip().startswith("4.") for line in lines)  # top=3
    assert "  allreduce: 1 x Mismatched allreduce tensor shapes" in lines
    assert "Cycle marks: 3" in lines


def test_dropped_events_are_reported(tool, tmp_path):
    path = three_cycles().write(tmp_path / "t.json", dropped=7)
    text = tool.format_summary(tool.summarize(tool.load(path)))
    assert "WARNING: the writer dropped 7 events" in text


def test_plot_without_matplotlib_says_how_to_install_it(tool, timeline_file, monkeypatch, tmp_path):
    summary = tool.summarize(tool.load(timeline_file))
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError) as raised:
        tool.plot(summary, str(tmp_path / "out.png"))
    assert "matplotlib is needed for --plot" in str(raised.value)
    assert "pip install matplotlib" in str(raised.value)
    assert "allreduce" in tool.format_summary(summary)  # the text summary still works


def test_plot_of_an_empty_timeline(tool, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "empty.png"
    tool.plot(tool.summarize([]), str(out))
    assert out.read_bytes().startswith(PNG_SIGNATURE)


def test_main_reports_a_bad_file_in_one_line_with_exit_code_2(tool, tmp_path, capsys):
    assert tool.main([str(tmp_path / "nope.json")]) == 2
    err = capsys.readouterr().err
    assert err == f"tfring.timeline: error: cannot read {tmp_path / 'nope.json'}: No such file or directory\n"
    (tmp_path / "bad.json").write_text("not json")
    assert tool.main([str(tmp_path / "bad.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tfring.timeline: error: ") and "is not a tfring timeline" in err
    assert err.count("\n") == 1


def test_main_json(tool, timeline_file, capsys):
    assert tool.main([timeline_file, "--json", "--top", "1"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["ops"] == EXPECTED_OPS
    assert [e["name"] for e in printed["slowest"]] == ["grad/a"]


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "tfring.timeline", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def test_cli_prints_the_summary_and_draws_the_plot(timeline_file, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "timeline.png"
    result = run_cli(timeline_file, "--top", "2", "--plot", str(out))
    assert result.returncode == 0, result.stderr
    assert "Time by op kind and phase" in result.stdout
    assert "Slowest tensors (first rank ready to end of op)" in result.stdout
    assert f"plot written to {out}" in result.stderr
    data = out.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 1000


def test_cli_json(timeline_file):
    result = run_cli(timeline_file, "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["ops"] == EXPECTED_OPS
    assert summary["batches"]["per_cycle_max"] == 2


def test_timeline_layout_has_a_row_per_tensor_with_marks_and_spans_in_ms(tool, timeline_file):
    layout = tool.timeline_layout(tool.load(timeline_file))
    assert layout["size"] == 3
    assert layout["window"] == (0.1, 2.065)  # first ready mark to the last op's end
    rows = {row["name"]: row for row in layout["rows"]}
    assert [row["name"] for row in layout["rows"]] == ["grad/a", "grad/b", "grad/c", "bcast/w"]
    a = rows["grad/a"]
    assert a["negotiations"] == [(0.1, 0.18), (1.0, 1.12)]
    assert sorted(a["ready"]) == [(0.1, 0), (0.13, 1), (0.16, 2), (1.0, 2), (1.01, 0), (1.1, 1)]
    assert a["ops"] == [(0.18, 0.28, "allreduce", None), (1.12, 1.19, "allreduce", None)]
    assert [p[2] for p in a["phases"]] == ["queue", "copy_in", "communicate", "copy_out",
                                           "callback", "copy_in", "communicate", "callback"]
    assert rows["grad/b"]["ops"][1] == (1.12, 1.13, "allreduce", "Mismatched allreduce tensor shapes")


def test_timeline_layout_window_keeps_what_overlaps_it(tool, timeline_file):
    layout = tool.timeline_layout(tool.load(timeline_file), window=(0.0, 0.5))
    assert layout["window"] == (0.0, 0.5)
    assert [row["name"] for row in layout["rows"]] == ["grad/a", "grad/b", "grad/c"]
    assert layout["rows"][0]["negotiations"] == [(0.1, 0.18)]
    # A span that starts inside and ends after the window is kept whole.
    layout = tool.timeline_layout(tool.load(timeline_file), window=(1.15, 1.5))
    assert [(row["name"], row["ops"]) for row in layout["rows"]] == [
        ("grad/a", [(1.12, 1.19, "allreduce", None)])]


def test_plot_timeline_draws_a_row_per_tensor_titled_without_the_path(tool, timeline_file, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "rows.png"
    figure = tool.plot_timeline(tool.load(timeline_file), str(out))
    assert out.read_bytes().startswith(PNG_SIGNATURE)
    [axes] = figure.axes
    assert [t.get_text() for t in axes.get_yticklabels()] == ["grad/a", "grad/b", "grad/c", "bcast/w"]
    assert axes.get_title() == "tfring timeline: 3 ranks, 4 tensors, 0.1 to 2.1 ms"
    legend = [t.get_text() for t in axes.get_legend().get_texts()]
    assert {"negotiate", "communicate", "rank 0 ready", "rank 2 ready"} <= set(legend)
    # The summary plot is titled with the file's name, not its directory.
    summary = tool.plot(tool.summarize(tool.load(timeline_file)), str(tmp_path / "s.png"))
    assert summary._suptitle.get_text() == "tfring timeline summary timeline.json"


def test_plot_timeline_of_an_empty_window(tool, timeline_file, tmp_path):
    pytest.importorskip("matplotlib")
    figure = tool.plot_timeline(tool.load(timeline_file), str(tmp_path / "e.png"), window=(5, 6))
    assert figure.axes[0].get_title() == "tfring timeline: 3 ranks, 0 tensors, 5.0 to 6.0 ms"


@pytest.mark.parametrize("window", ["12", "5:2", "a:b", ":"])
def test_main_refuses_a_bad_window(tool, timeline_file, window, capsys):
    assert tool.main([timeline_file, "--plot-timeline", "x.png", "--window", window]) == 2
    err = capsys.readouterr().err
    assert f"--window {window!r}: expected START:END in milliseconds" in err


def test_cli_draws_the_timeline_for_a_window(timeline_file, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "window.png"
    result = run_cli(timeline_file, "--plot-timeline", str(out), "--window", "0:0.5")
    assert result.returncode == 0, result.stderr
    assert f"timeline plot written to {out}" in result.stderr
    assert out.read_bytes().startswith(PNG_SIGNATURE)
