"""Summarise (and optionally plot) a tfring timeline file.

`TFRING_TIMELINE=/path/file.json` or `tfring.start_timeline(path)` makes rank 0
record every collective as Chrome trace events (format: docs/timeline.md).
A trace viewer shows *when* things happened; this tool answers *where the time
went*, which is the question one usually has when scaling is poor:

    python -m tfring.timeline FILE [--plot out.png] [--top N] [--json]
    python -m tfring.timeline FILE --plot-timeline out.png [--window START:END]

For each op kind (allreduce, allgather, ...) it splits the time into waiting
for the other ranks to submit the tensor, negotiation, queueing behind earlier
batches, copies into/out of the fusion buffer, the communication itself and the
framework callbacks. It reports how well tensors were fused into batches, and
lists the slowest tensors with the rank that kept the others waiting.
`--plot-timeline` draws the file itself, as a trace viewer would: time across,
a row per tensor, each rank's readiness, the negotiation and the op's phases
(`--window` picks the milliseconds to show, for a picture of a few steps).

This file only needs the standard library (matplotlib for --plot), and never
imports TensorFlow or the native core: where tfring is not installed (a laptop
with a timeline copied from a cluster), run it as
`python timeline.py FILE` (`python -m tfring.timeline` imports the tfring
package, and with it TensorFlow).
"""

import argparse
import bisect
import json
import os
import statistics
import sys
from collections import Counter, defaultdict

SUPPORTED_VERSION = 1

# Time columns in the order they happen to a tensor.
TIME_COLUMNS = ("waiting_for_ranks", "negotiation", "queue", "copies",
                "communication", "callback")
COLUMN_LABELS = {
    "waiting_for_ranks": "waiting for ranks",
    "negotiation": "negotiation",
    "queue": "queue",
    "copies": "copies",
    "communication": "communication",
    "callback": "callback",
}
# The plot draws waiting for ranks in the color of the slowest tensors' waiting.
COLUMN_COLORS = {
    "waiting_for_ranks": "tab:red",
    "negotiation": "tab:orange",
    "queue": "tab:olive",
    "copies": "tab:purple",
    "communication": "tab:blue",
    "callback": "tab:gray",
}
PHASE_COLUMN = {
    "queue": "queue",
    "copy_in": "copies",
    "copy_out": "copies",
    "communicate": "communication",
    "callback": "callback",
}

# A ready mark is computed as "agreement time minus how long the tensor waited
# on that rank", so it never lies after its negotiate span ends; allow for
# rounding of the microsecond timestamps.
MATCH_TOLERANCE_US = 1.0

DEFAULT_TOP = 10
FILE_PREFIX = '{"traceEvents":['
WHAT_WAS_EXPECTED = (
    "expected a tfring timeline: the Chrome trace-event JSON that rank 0 writes "
    "for TFRING_TIMELINE=/path/file.json or tfring.start_timeline(path), "
    f"starting with {FILE_PREFIX}")
INCOMPLETE_REASON = (
    "the file has no closing line, so the job ended without tfring.shutdown(), "
    "tfring.stop_timeline() or a normal interpreter exit (most likely it was "
    "killed: a scheduler time limit, the OOM killer, SIGKILL), or it is still "
    "running")
DAMAGED_REASON = (
    "the file has its closing line but some lines in it are not valid JSON, so it "
    "was damaged after it was written (or two jobs wrote to the same path)")


# --------------------------------------------------------------------------
# Loading


class TimelineEvents(list):
    """The events of a timeline file, plus what `load` learned about the file.

    Attributes: `path`, `complete` (False when the closing line was missing and
    the events were recovered line by line), `incomplete_reason`,
    `skipped_lines` (lines of an incomplete file that held no complete event)
    and `other_data` (the file's "otherData": size, dropped_events, ...).
    """

    def __init__(self, events=(), path=None, complete=True, incomplete_reason=None,
                 skipped_lines=0, other_data=None):
        super().__init__(events)
        self.path = path
        self.complete = complete
        self.incomplete_reason = incomplete_reason
        self.skipped_lines = skipped_lines
        self.other_data = dict(other_data or {})


def load(path):
    """Return the events of the timeline at `path` as a `TimelineEvents` list.

    A complete file is parsed as JSON. A file whose job died before the closing
    line was written is parsed line by line, keeping the complete events (the
    returned list then has `complete == False`). Raises OSError when the file
    cannot be read and ValueError when it is not a tfring timeline.
    """
    text = read_text(path)
    try:
        document = json.loads(text)
    except ValueError:
        return parse_incomplete(text, path)
    return events_of_document(document, path)


def read_text(path):
    with open(path, "rb") as f:
        data = f.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not a tfring timeline: {WHAT_WAS_EXPECTED}; "
                         "found binary data") from None


def describe_start(text):
    start = text.lstrip()[:40]
    return f"a file starting with {start!r}" if start else "an empty file"


def not_a_timeline(path, found):
    return ValueError(f"{path} is not a tfring timeline: {WHAT_WAS_EXPECTED}; found {found}")


def events_of_document(document, path):
    if not isinstance(document, dict) or not isinstance(document.get("traceEvents"), list):
        kind = type(document).__name__
        keys = f" with keys {sorted(document)[:5]}" if isinstance(document, dict) else ""
        raise not_a_timeline(path, f"JSON of another shape (a {kind}{keys})")
    other_data = document.get("otherData")
    other_data = other_data if isinstance(other_data, dict) else {}
    version = other_data.get("tfring_timeline_version")
    if isinstance(version, int) and version > SUPPORTED_VERSION:
        raise ValueError(
            f"{path} is a tfring timeline of version {version}; this tool reads "
            f"version {SUPPORTED_VERSION}: use the tfring that wrote it")
    events = [e for e in document["traceEvents"] if isinstance(e, dict)]
    return TimelineEvents(events, path=path, other_data=other_data)


def parse_incomplete(text, path):
    """Recover the complete events of a file that is not valid JSON, one line at a time."""
    body = text.lstrip()
    if not body.startswith(FILE_PREFIX):
        raise not_a_timeline(path, describe_start(text))
    events, skipped, closing = [], 0, None
    for line in body[len(FILE_PREFIX):].splitlines():
        line = line.strip().strip(",").strip()
        if line.startswith("]"):
            closing = parse_closing_line(line)
            continue
        if not line:
            continue
        event = parse_json_or_none(line)
        if isinstance(event, dict):
            events.append(event)
        else:
            skipped += 1
    reason = INCOMPLETE_REASON if closing is None else DAMAGED_REASON
    return TimelineEvents(events, path=path, complete=False, incomplete_reason=reason,
                          skipped_lines=skipped, other_data=(closing or {}).get("otherData"))


def parse_json_or_none(text):
    try:
        return json.loads(text)
    except ValueError:
        return None


def parse_closing_line(line):
    """`],"displayTimeUnit":...,"otherData":{...}}` -> the dict of its keys (or {} if cut off)."""
    closing = parse_json_or_none("{" + line[1:].lstrip(","))
    return closing if isinstance(closing, dict) else {}


# --------------------------------------------------------------------------
# Summarising


def span_end(event):
    return event.get("ts", 0) + event.get("dur", 0)


def args_of(event):
    args = event.get("args")
    return args if isinstance(args, dict) else {}


class Occurrence:
    """One negotiation of one tensor: its negotiate span and the ranks' ready marks."""

    def __init__(self, negotiate):
        self.negotiate = negotiate
        self.ready_by_rank = {}
        self.op_of_span = None  # the name of the op span matched to it, if any

    @property
    def end(self):
        return span_end(self.negotiate)

    @property
    def op(self):
        return args_of(self.negotiate).get("op") or self.op_of_span

    @property
    def last_ready_rank(self):
        return args_of(self.negotiate).get("last_ready_rank")

    def first_ready(self):
        return min(self.ready_by_rank.values(), default=self.negotiate.get("ts", 0))

    def last_ready(self):
        return max(self.ready_by_rank.values(), default=self.first_ready())

    def waiting_for_ranks(self):
        return self.last_ready() - self.first_ready()

    def negotiation(self):
        return self.end - self.last_ready()

    def lateness_of_last_rank(self):
        late = self.ready_by_rank.get(self.last_ready_rank, self.last_ready())
        return late - self.first_ready()


class Row:
    """The events of one tensor's row, with negotiations matched to ready marks and ops."""

    def __init__(self, name):
        self.name = name
        self.occurrences = []
        self.ready_marks = []
        self.op_spans = []
        self.phase_spans = []
        self.ends = []

    def match(self):
        """Attach ready marks and op spans to their negotiations; return (op span, occurrence or None) pairs."""
        self.occurrences.sort(key=lambda o: o.end)
        self.ends = [o.end for o in self.occurrences]
        for mark in self.ready_marks:
            # The mark belongs to the first negotiation that ends at or after it.
            i = bisect.bisect_left(self.ends, mark.get("ts", 0) - MATCH_TOLERANCE_US)
            if i < len(self.occurrences):
                self.occurrences[i].ready_by_rank.setdefault(args_of(mark).get("rank"), mark.get("ts", 0))
        pairs, taken = [], set()
        for span in sorted(self.op_spans, key=lambda e: e.get("ts", 0)):
            i = self.index_of_negotiation_before(span.get("ts", 0))
            occurrence = None
            if i is not None and i not in taken:
                taken.add(i)
                occurrence = self.occurrences[i]
                occurrence.op_of_span = span.get("name")
            pairs.append((span, occurrence))
        return pairs

    def index_of_negotiation_before(self, ts):
        """The last negotiation that ended by `ts` (an op span starts when its negotiation ends)."""
        i = bisect.bisect_right(self.ends, ts + MATCH_TOLERANCE_US) - 1
        return i if i >= 0 else None

    def op_before(self, ts):
        i = self.index_of_negotiation_before(ts)
        return self.occurrences[i].op if i is not None else None


def rows_of(events):
    """Group the events by row (pid); return ({pid: Row}, cycle mark count)."""
    names = {}
    rows = defaultdict(lambda: Row(None))
    cycle_marks = 0
    for event in events:
        ph, cat, pid = event.get("ph"), event.get("cat"), event.get("pid")
        if ph == "M" and event.get("name") == "process_name":
            names[pid] = args_of(event).get("name")
        elif ph == "X" and cat == "negotiate":
            rows[pid].occurrences.append(Occurrence(event))
        elif ph == "i" and cat == "ready":
            rows[pid].ready_marks.append(event)
        elif ph == "X" and cat == "op":
            rows[pid].op_spans.append(event)
        elif ph == "X" and cat == "phase":
            rows[pid].phase_spans.append(event)
        elif ph == "i" and cat == "cycle":
            cycle_marks += 1
    for pid, row in rows.items():
        row.name = names.get(pid) or f"pid {pid}"
    return dict(rows), cycle_marks


def new_op_stats():
    return {"tensors": 0, "bytes": 0, "errors": 0,
            "time_us": {column: 0 for column in TIME_COLUMNS}, "total_us": 0}


def batch_key(span, pid):
    batch = args_of(span).get("batch")
    return batch if batch is not None else ("unbatched", pid, span.get("ts"))


def summarize(events, top=DEFAULT_TOP):
    """Return a JSON-serialisable dict describing where the time of a timeline went.

    `events` is what `load` returns (a plain list of event dicts works too).
    Times are microseconds summed over tensors: spans of tensors that were in
    flight together overlap, so they add up to more than the wall-clock time.
    Keys: "source", "ops" (per op kind: tensors, bytes, errors, time_us per
    column of TIME_COLUMNS, total_us), "total_us", "batches", "cycle_marks",
    "slowest" (the `top` slowest tensor occurrences) and "errors".
    """
    rows, cycle_marks = rows_of(events)
    ops = defaultdict(new_op_stats)
    batches = {}
    occurrences_of_ops = []
    error_messages = Counter()

    for pid, row in rows.items():
        for span, occurrence in row.match():
            op = span.get("name") or "unknown"
            args = args_of(span)
            stats = ops[op]
            stats["tensors"] += 1
            stats["bytes"] += args.get("bytes", 0) or 0
            if args.get("error"):
                stats["errors"] += 1
                error_messages[(op, str(args["error"]))] += 1
            record_batch_member(batches, batch_key(span, pid), op, args)
            occurrences_of_ops.append((row.name, op, span, occurrence))
        for occurrence in row.occurrences:
            stats = ops[occurrence.op or "unknown"]
            stats["time_us"]["waiting_for_ranks"] += occurrence.waiting_for_ranks()
            stats["time_us"]["negotiation"] += occurrence.negotiation()

    add_phase_times(rows, batches, ops)
    for stats in ops.values():
        stats["total_us"] = sum(stats["time_us"].values())

    return {
        "source": describe_source(events),
        "ops": dict(sorted(ops.items(), key=lambda item: -item[1]["total_us"])),
        "total_us": sum(stats["total_us"] for stats in ops.values()),
        "batches": summarize_batches(batches),
        "cycle_marks": cycle_marks,
        "slowest": slowest_tensors(occurrences_of_ops, top),
        "errors": [{"op": op, "message": message, "count": count}
                   for (op, message), count in error_messages.most_common()],
    }


def record_batch_member(batches, key, op, args):
    batch = batches.setdefault(key, {"op": op, "cycle": args.get("cycle"), "members": 0,
                                     "member_bytes": 0, "tensors": None, "bytes": None,
                                     "fused": False})
    batch["members"] += 1
    batch["member_bytes"] += args.get("bytes", 0) or 0
    if args.get("batch_tensors") is not None:
        batch["tensors"] = args["batch_tensors"]
    if args.get("batch_bytes") is not None:
        batch["bytes"] = args["batch_bytes"]
    batch["fused"] = batch["fused"] or bool(args.get("fused"))


def add_phase_times(rows, batches, ops):
    """Add each (batch, phase) span once, to the op kind of its batch."""
    seen = set()
    for pid, row in rows.items():
        for span in row.phase_spans:
            column = PHASE_COLUMN.get(span.get("name"))
            key = (batch_key(span, pid), span.get("name"))
            if column is None or key in seen:
                continue
            seen.add(key)
            batch = batches.get(key[0])
            op = batch["op"] if batch else row.op_before(span.get("ts", 0))
            ops[op or "unknown"]["time_us"][column] += span.get("dur", 0)


def describe_source(events):
    other = getattr(events, "other_data", {}) or {}
    return {
        "path": getattr(events, "path", None),
        "complete": getattr(events, "complete", True),
        "incomplete_reason": getattr(events, "incomplete_reason", None),
        "skipped_lines": getattr(events, "skipped_lines", 0),
        "events": len(events),
        "ranks": other.get("size"),
        "dropped_events": other.get("dropped_events"),
    }


def min_median_max(values):
    if not values:
        return {"min": None, "median": None, "max": None}
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def summarize_batches(batches):
    per_cycle = Counter(b["cycle"] for b in batches.values() if b["cycle"] is not None)
    counts = list(per_cycle.values())
    tensors = [b["tensors"] if b["tensors"] is not None else b["members"] for b in batches.values()]
    sizes = [b["bytes"] if b["bytes"] is not None else b["member_bytes"] for b in batches.values()]
    fused = sum(1 for b in batches.values() if b["fused"])
    return {
        "count": len(batches),
        "cycles": len(counts),
        "per_cycle_mean": statistics.mean(counts) if counts else None,
        "per_cycle_max": max(counts) if counts else None,
        "tensors_per_batch": min_median_max(tensors),
        "bytes_per_batch": min_median_max(sizes),
        "fused_fraction": fused / len(batches) if batches else None,
    }


def slowest_tensors(occurrences_of_ops, top):
    entries = []
    for name, op, span, occurrence in occurrences_of_ops:
        start = occurrence.first_ready() if occurrence else span.get("ts", 0)
        entries.append({
            "name": name,
            "op": op,
            "start_us": start,
            "total_us": span_end(span) - start,
            "last_ready_rank": occurrence.last_ready_rank if occurrence else None,
            "late_by_us": occurrence.lateness_of_last_rank() if occurrence else None,
            "error": args_of(span).get("error"),
        })
    entries.sort(key=lambda e: (-e["total_us"], e["start_us"], e["name"]))
    return entries[:max(top, 0)]


# --------------------------------------------------------------------------
# Text output


def ms(us):
    return f"{us / 1000:.3f}"


def percent(part, whole):
    return f"{100 * part / whole:.1f}%" if whole else "-"


def human_bytes(n):
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:g} B" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"  # unreachable


def table(header, rows, align):
    """Align columns: `align` has one letter per column, "l" (text) or "r" (numbers)."""
    cells = [header] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]

    def line(row):
        parts = [c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(row, widths, align)]
        return "  " + "  ".join(parts).rstrip()
    return [line(row) for row in cells]


def source_lines(source):
    facts = [f"{source['events']} events"]
    if source.get("ranks") is not None:
        facts.insert(0, f"{source['ranks']} ranks")
    title = " ".join(filter(None, ["tfring timeline", source.get("path")]))
    lines = [f"{title} ({', '.join(facts)})"]
    if not source.get("complete", True):
        lines.append(f"WARNING: incomplete file: {source['incomplete_reason']}. "
                     f"Summarising the {source['events']} complete events"
                     + (f" ({source['skipped_lines']} cut-off line(s) skipped)."
                        if source.get("skipped_lines") else "."))
    if source.get("dropped_events"):
        lines.append(f"WARNING: the writer dropped {source['dropped_events']} events "
                     "(the disk could not keep up): the numbers below are lower bounds.")
    return lines


def op_count_lines(summary):
    rows = [[op, s["tensors"], human_bytes(s["bytes"]), s["errors"]]
            for op, s in summary["ops"].items()]
    return ["Tensors by op kind"] + table(["op kind", "tensors", "bytes", "errors"], rows, "lrrr")


def time_lines(summary):
    total = summary["total_us"]
    rows = []
    for op, stats in summary["ops"].items():
        for i, column in enumerate(TIME_COLUMNS):
            us = stats["time_us"][column]
            rows.append([op if i == 0 else "", COLUMN_LABELS[column], ms(us),
                         percent(us, stats["total_us"]), percent(us, total)])
        rows.append(["", "total", ms(stats["total_us"]), percent(stats["total_us"], stats["total_us"]),
                     percent(stats["total_us"], total)])
    rows.append(["all ops", "total", ms(total), "", percent(total, total)])
    header = ["op kind", "phase", "ms", "% of op", "% of all"]
    return (["Time by op kind and phase (summed over tensors; tensors in flight "
             "together overlap, so this exceeds wall-clock time)"] + table(header, rows, "llrrr"))


def batch_lines(batches):
    if not batches["count"]:
        return ["Batches: none"]
    lines = ["Batches"]
    if batches["cycles"]:
        lines.append(f"  {batches['count']} batches in {batches['cycles']} cycles: "
                     f"{batches['per_cycle_mean']:.2f} per cycle on average, "
                     f"at most {batches['per_cycle_max']}")
    else:
        lines.append(f"  {batches['count']} batches")
    t, b = batches["tensors_per_batch"], batches["bytes_per_batch"]
    lines.append(f"  tensors per batch: min {t['min']}, median {t['median']}, max {t['max']}")
    lines.append(f"  bytes per batch:   min {human_bytes(b['min'])}, "
                 f"median {human_bytes(b['median'])}, max {human_bytes(b['max'])}")
    lines.append(f"  fused (several tensors in one collective): {percent(batches['fused_fraction'], 1)} of batches")
    return lines


def slowest_lines(slowest):
    if not slowest:
        return ["Slowest tensors: none"]
    rows = []
    for i, entry in enumerate(slowest, 1):
        rank = entry["last_ready_rank"]
        rows.append([f"{i}.", entry["name"], entry["op"], ms(entry["total_us"]),
                     "-" if rank is None else f"rank {rank}",
                     "-" if entry["late_by_us"] is None else ms(entry["late_by_us"]),
                     "error" if entry["error"] else ""])
    header = ["#", "tensor", "op", "total ms", "waited for", "late by ms", ""]
    return ["Slowest tensors (first rank ready to end of op)"] + table(header, rows, "rllrlrl")


def error_lines(errors):
    if not errors:
        return []
    lines = ["Errors"]
    for error in errors:
        lines.append(f"  {error['op']}: {error['count']} x {error['message']}")
    return lines


def format_summary(summary):
    """Return the human-readable report of a `summarize` result."""
    sections = [source_lines(summary["source"])]
    if not summary["ops"]:
        sections.append(["No collective operations recorded."])
    else:
        sections += [op_count_lines(summary), time_lines(summary),
                     batch_lines(summary["batches"]), slowest_lines(summary["slowest"])]
        if summary["cycle_marks"]:
            sections.append([f"Cycle marks: {summary['cycle_marks']}"])
        sections.append(error_lines(summary["errors"]))
    return "\n\n".join("\n".join(lines) for lines in sections if lines) + "\n"


# --------------------------------------------------------------------------
# Plot


def import_matplotlib():
    try:
        import matplotlib  # noqa: F401  (a stale submodule must not hide a missing package)
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError(
            "matplotlib is needed for --plot (tfring.timeline.plot); install it with "
            "`pip install matplotlib`. The text summary works without it.") from e
    return Figure, FigureCanvasAgg


def plot(summary, out_path):
    """Draw the summary to a PNG at `out_path` (needs matplotlib; uses the Agg
    backend); returns the matplotlib Figure.

    Top panel: one stacked bar per op kind splitting its time into the phases.
    Bottom panel: the slowest tensors; the bar is the total time, its colored
    part the time spent waiting for the late rank (labelled).
    """
    Figure, FigureCanvasAgg = import_matplotlib()
    ops, slowest = summary["ops"], summary["slowest"]
    height = 2.5 + 0.45 * (max(len(ops), 1) + max(len(slowest), 1))
    figure = Figure(figsize=(11, height), layout="constrained")
    FigureCanvasAgg(figure)
    top_axes, bottom_axes = figure.subplots(2, 1, gridspec_kw={
        "height_ratios": [max(len(ops), 1) + 1, max(len(slowest), 1) + 1]})
    draw_phase_bars(top_axes, ops)
    draw_slowest(bottom_axes, slowest)
    # The file's name, not its directory (a /tmp path says nothing to the reader).
    name = os.path.basename(summary["source"].get("path") or "")
    figure.suptitle(f"tfring timeline summary {name}".strip())
    figure.savefig(out_path, format="png", dpi=100)
    return figure


def draw_phase_bars(axes, ops):
    axes.set_title("Time by op kind and phase (summed over tensors)")
    axes.set_xlabel("ms")
    if not ops:
        axes.text(0.5, 0.5, "no collective operations recorded", ha="center", va="center",
                  transform=axes.transAxes)
        return
    names = list(ops)
    left = [0.0] * len(names)
    for column in TIME_COLUMNS:
        widths = [ops[op]["time_us"][column] / 1000 for op in names]
        axes.barh(names, widths, left=left, label=COLUMN_LABELS[column],
                  color=COLUMN_COLORS[column])
        left = [a + b for a, b in zip(left, widths)]
    axes.invert_yaxis()
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")


def draw_slowest(axes, slowest):
    axes.set_title("Slowest tensors: total time, and the part spent waiting for the late rank")
    axes.set_xlabel("ms")
    if not slowest:
        axes.text(0.5, 0.5, "no tensors", ha="center", va="center", transform=axes.transAxes)
        return
    labels = [f"{shorten(e['name'])} ({e['op']})" for e in slowest]
    positions = range(len(slowest))
    axes.barh(positions, [e["total_us"] / 1000 for e in slowest], color="lightgray", label="total")
    waits = [(e["late_by_us"] or 0) / 1000 for e in slowest]
    axes.barh(positions, waits, color=COLUMN_COLORS["waiting_for_ranks"],
              label="waiting for the late rank")
    for y, entry, wait in zip(positions, slowest, waits):
        if entry["last_ready_rank"] is not None:
            axes.text(wait, y, f" rank {entry['last_ready_rank']} late by {ms(entry['late_by_us'] or 0)} ms",
                      va="center", fontsize="small")
    axes.set_yticks(list(positions), labels)
    axes.invert_yaxis()
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")


def timeline_layout(events, window=None):
    """What --plot-timeline draws, in milliseconds since recording started.

    Returns {"window": (start, end), "size": ranks or None, "rows": [...]},
    one row per tensor that has something inside the window, in the file's
    row order, each {"name", "negotiations": [(start, end)], "ready": [(ms,
    rank)], "ops": [(start, end, op, error or None)], "phases": [(start, end,
    phase)]}. `window` is (start_ms, end_ms) or None for the whole file.
    """
    rows, _ = rows_of(events)
    items = {}
    for pid, row in sorted(rows.items(), key=lambda item: item[0]):
        items[pid] = {
            "name": row.name,
            "negotiations": [(o.negotiate.get("ts", 0) / 1000, o.end / 1000)
                             for o in row.occurrences],
            "ready": [(m.get("ts", 0) / 1000, args_of(m).get("rank")) for m in row.ready_marks],
            "ops": [(s.get("ts", 0) / 1000, span_end(s) / 1000, s.get("name"),
                     args_of(s).get("error")) for s in row.op_spans],
            "phases": [(s.get("ts", 0) / 1000, span_end(s) / 1000, s.get("name"))
                       for s in row.phase_spans],
        }
    times = [t for row in items.values() for key in ("negotiations", "ready", "ops", "phases")
             for item in row[key] for t in item[:1 if key == "ready" else 2]]
    if window is None:
        window = (min(times, default=0.0), max(times, default=0.0))
    start, end = window

    def inside(item, key):
        first, last = (item[0], item[0]) if key == "ready" else (item[0], item[1])
        return last >= start and first <= end

    shown = []
    for row in items.values():
        kept = {key: [i for i in row[key] if inside(i, key)]
                for key in ("negotiations", "ready", "ops", "phases")}
        if any(kept.values()):
            shown.append({"name": row["name"], **kept})
    size = getattr(events, "other_data", {}).get("size")
    return {"window": (start, end), "size": size, "rows": shown}


# Phase colors follow the summary's columns; the negotiation is drawn thin
# above the op, and each rank's ready mark in a color of its own.
NEGOTIATION_COLOR = "tab:orange"
OP_COLOR = "whitesmoke"


def plot_timeline(events, out_path, window=None):
    """Draw the timeline itself to a PNG at `out_path`: time across, one row
    per tensor (as chrome://tracing or Perfetto show the file), with each
    rank's ready mark, the negotiation span and the op's phases (needs
    matplotlib); returns the matplotlib Figure."""
    Figure, FigureCanvasAgg = import_matplotlib()
    layout = timeline_layout(events, window)
    rows = layout["rows"]
    figure = Figure(figsize=(12, 1.6 + 0.42 * max(len(rows), 1)), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots()
    ranks = sorted({rank for row in rows for _, rank in row["ready"] if rank is not None})
    palette = ["tab:green", "tab:red", "tab:cyan", "tab:pink", "tab:brown", "black",
               "tab:olive", "tab:purple"]
    rank_colors = {rank: palette[i % len(palette)] for i, rank in enumerate(ranks)}
    labelled = set()

    def label(key):  # each legend entry once
        if key in labelled:
            return None
        labelled.add(key)
        return key

    for y, row in enumerate(rows):
        for start, end in row["negotiations"]:
            axes.barh(y - 0.3, end - start, left=start, height=0.16, color=NEGOTIATION_COLOR,
                      label=label("negotiate"))
        for start, end, op, error in row["ops"]:
            axes.barh(y + 0.05, end - start, left=start, height=0.55, color=OP_COLOR,
                      edgecolor="tab:red" if error else "gray", linewidth=0.6,
                      label=label("op span"))
        for start, end, phase in row["phases"]:
            column = PHASE_COLUMN.get(phase)
            if column is None:
                continue
            axes.barh(y + 0.05, end - start, left=start, height=0.45,
                      color=COLUMN_COLORS[column], label=label(phase))
        for ts, rank in row["ready"]:
            # Each rank's marks at a height of their own, so that ranks
            # ready at the same moment stay visible.
            lane = ranks.index(rank) / max(len(ranks) - 1, 1) if rank in ranks else 0
            axes.plot([ts], [y - 0.42 + 0.2 * lane], marker="v", markersize=6,
                      linestyle="none", color=rank_colors.get(rank, "black"),
                      label=label(f"rank {rank} ready"))
    axes.set_yticks(range(len(rows)), [shorten(row["name"], 48) for row in rows])
    axes.set_ylim(len(rows) - 0.4, -0.7)
    start, end = layout["window"]
    if end > start:
        axes.set_xlim(start, end)
    axes.set_xlabel("ms since the timeline started (rank 0's clock)")
    if not rows:
        axes.text(0.5, 0.5, "no collective operations in this window", ha="center",
                  va="center", transform=axes.transAxes)
    ranks_text = f"{layout['size']} ranks, " if layout["size"] else ""
    axes.set_title(f"tfring timeline: {ranks_text}{len(rows)} tensors, "
                   f"{start:.1f} to {end:.1f} ms")
    if labelled:
        axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    figure.savefig(out_path, format="png", dpi=100)
    return figure


def parse_window(text):
    """'START:END' in milliseconds -> (start, end); raises ValueError."""
    first, sep, last = text.partition(":")
    try:
        start, end = float(first), float(last)
    except ValueError:
        start = end = None
    if not sep or start is None or not start < end:
        raise ValueError(f"--window {text!r}: expected START:END in milliseconds since the "
                         f"timeline started, START below END, e.g. --window 1200:1500")
    return start, end


def shorten(name, limit=40):
    return name if len(name) <= limit else "..." + name[-(limit - 3):]


# --------------------------------------------------------------------------
# Command line


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m tfring.timeline",
        description="Summarise a tfring timeline (TFRING_TIMELINE=FILE): where the "
                    "time of the collectives went, fusion, and the slowest tensors.")
    parser.add_argument("file", help="the timeline JSON written by rank 0")
    parser.add_argument("--plot", metavar="OUT.png", help="also draw the summary to a PNG (needs matplotlib)")
    parser.add_argument("--plot-timeline", metavar="OUT.png",
                        help="also draw the timeline itself to a PNG: time across, a row per "
                             "tensor, each rank's readiness and the op's phases (needs matplotlib)")
    parser.add_argument("--window", metavar="START:END",
                        help="with --plot-timeline, the milliseconds (since the timeline "
                             "started) to draw; default: the whole file")
    parser.add_argument("--top", type=int, default=DEFAULT_TOP, metavar="N",
                        help=f"how many slowest tensors to list (default {DEFAULT_TOP})")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    try:
        window = parse_window(args.window) if args.window is not None else None
    except ValueError as e:
        print(f"tfring.timeline: error: {e}", file=sys.stderr)
        return 2
    try:
        events = load(args.file)
    except OSError as e:
        print(f"tfring.timeline: error: cannot read {args.file}: {e.strerror or e}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"tfring.timeline: error: {e}", file=sys.stderr)
        return 2
    summary = summarize(events, top=args.top)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(format_summary(summary), end="")
    if args.plot:
        try:
            plot(summary, args.plot)
        except ImportError as e:
            print(f"tfring.timeline: error: {e}", file=sys.stderr)
            return 1
        print(f"plot written to {args.plot}", file=sys.stderr)
    if args.plot_timeline:
        try:
            plot_timeline(events, args.plot_timeline, window)
        except ImportError as e:
            print(f"tfring.timeline: error: {e}", file=sys.stderr)
            return 1
        print(f"timeline plot written to {args.plot_timeline}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
