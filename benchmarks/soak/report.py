"""The soak's verdict and report: from every rank's figures (gathered on
rank 0) to the checks that pass or fail, a printed report and its JSON.

Why its own file: the figures are measured on every rank, but judged once,
in one place, with the bounds written next to the checks. The checks that
decide the exit status are results, memory growth, threads and file
descriptors; step times are reported (in windows, to show drift) and never
judged, since the machine may be shared.
"""

import numpy as np


def _step_windows(ranks, window):
    """Per window of `window` steps: the median and 90th percentile of the
    step time, taking each step's time as its slowest rank's."""
    per_rank = [np.asarray(r["step_seconds"]) for r in ranks]
    steps = min(len(t) for t in per_rank)
    if steps == 0:
        return []
    slowest = np.max([t[:steps] for t in per_rank], axis=0) * 1e3
    windows = []
    for start in range(0, steps, window):
        times = slowest[start:start + window]
        windows.append({"first_step": start,
                        "last_step": start + len(times) - 1,
                        "median_ms": round(float(np.median(times)), 3),
                        "p90_ms": round(float(np.percentile(times, 90)), 3)})
    return windows


def _growth(before, after):
    if before is None or after is None:
        return None
    return round(after - before, 2)


def _memory(rank):
    start, warmup, end = rank["start"], rank["warmup"], rank["end"]
    peak = max(s["rss_mib"] for s in rank["samples"])
    return {"start_mib": start["rss_mib"], "warmup_mib": warmup["rss_mib"],
            "end_mib": end["rss_mib"], "peak_mib": peak,
            "growth_after_warmup_mib": _growth(warmup["rss_mib"],
                                               end["rss_mib"]),
            "private_growth_after_warmup_mib": _growth(warmup["anon_mib"],
                                                       end["anon_mib"]),
            "shared_memory_end_mib": end["shmem_mib"],
            "heap_in_use_warmup_mib": warmup["heap_in_use_mib"],
            "heap_in_use_end_mib": end["heap_in_use_mib"],
            "heap_growth_after_warmup_mib": _growth(
                warmup["heap_in_use_mib"], end["heap_in_use_mib"])}


def _counts(rank, field):
    return {"start": rank["start"][field], "warmup": rank["warmup"][field],
            "end": rank["end"][field],
            "max": max(s[field] for s in rank["samples"])}


def evaluate(ranks, settings):
    """The checks over every rank's figures; returns the report dict."""
    bound = settings["max_growth_mib"]
    memory = {r["rank"]: _memory(r) for r in ranks}
    threads = {r["rank"]: {"python": _counts(r, "python_threads"),
                           "tasks": _counts(r, "tasks")} for r in ranks}
    fds = {r["rank"]: _counts(r, "fds") for r in ranks}
    failures = [f for r in ranks for f in r["failures"]]
    results_ok = (all(r["mismatches"] == 0 and r["errors"] == 0 and
                      r["steps_done"] == settings["steps"] for r in ranks))
    memory_ok = all(m["growth_after_warmup_mib"] <= bound
                    for m in memory.values())
    # Nothing may be left running or open that was not there after the
    # warm-up (fewer is fine: pools may shrink).
    threads_ok = all(t["python"]["end"] <= t["python"]["warmup"] and
                     t["tasks"]["end"] <= t["tasks"]["warmup"]
                     for t in threads.values())
    fds_ok = all(f["end"] <= f["warmup"] for f in fds.values())
    windows = _step_windows(ranks, settings["window_steps"])
    after_warmup = [w for w in windows
                    if w["first_step"] >= settings["warmup_steps"]]
    checks = {
        "results": {"passed": results_ok,
                    "tensors_checked": {r["rank"]: r["tensors_checked"]
                                        for r in ranks},
                    "outputs_checked": {r["rank"]: r["outputs_checked"]
                                        for r in ranks},
                    "inputs_checked": {r["rank"]: r["inputs_checked"]
                                       for r in ranks},
                    "mismatches": {r["rank"]: r["mismatches"] for r in ranks},
                    "errors": {r["rank"]: r["errors"] for r in ranks},
                    "steps_done": {r["rank"]: r["steps_done"]
                                   for r in ranks}},
        "memory": {"passed": memory_ok, "bound_mib": bound,
                   "per_rank": memory},
        "threads": {"passed": threads_ok, "per_rank": threads},
        "fds": {"passed": fds_ok, "per_rank": fds},
    }
    return {
        "passed": all(c["passed"] for c in checks.values()),
        "settings": settings,
        "checks": checks,
        "step_time": {
            "window_steps": settings["window_steps"],
            "windows": windows,
            "first": windows[0] if windows else None,
            "first_after_warmup": after_warmup[0] if after_warmup else None,
            "last": windows[-1] if windows else None,
        },
        "check_seconds": {r["rank"]: round(r["check_seconds"], 2)
                          for r in ranks},
        "failures": failures[:50],
        "failure_count": len(failures),
    }


def _verdict(passed):
    return "PASS" if passed else "FAIL"


def format_text(report, header, coverage, wall_seconds, loop_seconds):
    """The printed report (wall time on rank 0: from start-up, and in the
    steps with their checks)."""
    s = report["settings"]
    checks = report["checks"]
    lines = list(header)
    lines.append(f"steps {s['steps']} (warm-up {s['warmup_steps']}), seed "
                 f"{s['seed']}, {s['size']} ranks; wall time "
                 f"{wall_seconds:.1f} s ({loop_seconds:.1f} s in the steps "
                 "and their checks)")
    lines.append("")
    lines.append("plan coverage (the same on every rank):")
    for key, value in coverage.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k} {v}" for k, v in value.items())
        lines.append(f"  {key}: {value}")
    lines.append("")

    results = checks["results"]
    lines.append(f"results: {_verdict(results['passed'])}")
    for rank in sorted(results["tensors_checked"]):
        lines.append(
            f"  rank {rank}: {results['steps_done'][rank]} steps, "
            f"{results['tensors_checked'][rank]} tensors "
            f"({results['outputs_checked'][rank]} outputs) checked against "
            f"NumPy, {results['inputs_checked'][rank]} inputs unchanged "
            f"checked; {results['mismatches'][rank]} mismatches, "
            f"{results['errors'][rank]} errors")
    for failure in report["failures"][:10]:
        lines.append(f"  {failure}")
    if report["failure_count"] > 10:
        lines.append(f"  ... {report['failure_count'] - 10} more")

    memory = checks["memory"]
    lines.append(f"memory: {_verdict(memory['passed'])} (resident memory "
                 f"growth after the warm-up at most {memory['bound_mib']} "
                 "MiB per rank)")
    lines.append("  rank  RSS MiB: start  warm-up      end     peak   "
                 "growth (private)   heap in use: warm-up      end   growth")
    for rank, m in sorted(memory["per_rank"].items()):
        heap = "   (no glibc mallinfo2)"
        if m["heap_growth_after_warmup_mib"] is not None:
            heap = (f"{m['heap_in_use_warmup_mib']:>21.1f} "
                    f"{m['heap_in_use_end_mib']:>8.1f} "
                    f"{m['heap_growth_after_warmup_mib']:>+8.1f}")
        lines.append(f"  {rank:>4} {m['start_mib']:>14.1f} "
                     f"{m['warmup_mib']:>8.1f} {m['end_mib']:>8.1f} "
                     f"{m['peak_mib']:>8.1f} "
                     f"{m['growth_after_warmup_mib']:>+8.1f} "
                     f"({m['private_growth_after_warmup_mib']:+.1f})"
                     f"{heap}")
    lines.append("  (private: anonymous memory; heap in use: bytes malloc'd "
                 "and not freed, which allocator noise does not move)")

    threads = checks["threads"]
    lines.append(f"threads: {_verdict(threads['passed'])} (no more at the "
                 "end than after the warm-up)")
    for rank, t in sorted(threads["per_rank"].items()):
        py, tasks = t["python"], t["tasks"]
        lines.append(f"  rank {rank}: Python threads {py['start']} at start, "
                     f"{py['warmup']} after warm-up, {py['end']} at end; "
                     f"all threads (/proc/self/task) {tasks['start']}, "
                     f"{tasks['warmup']}, {tasks['end']} (max "
                     f"{tasks['max']})")
    fds = checks["fds"]
    lines.append(f"file descriptors: {_verdict(fds['passed'])} (no more at "
                 "the end than after the warm-up)")
    for rank, f in sorted(fds["per_rank"].items()):
        lines.append(f"  rank {rank}: {f['start']} at start, {f['warmup']} "
                     f"after warm-up, {f['end']} at end (max {f['max']})")

    timing = report["step_time"]
    lines.append(f"step time (reported, not checked; each step's slowest "
                 f"rank, collectives only, windows of "
                 f"{timing['window_steps']} steps): median / p90 ms")
    for w in timing["windows"]:
        mark = ""
        if w is timing["first_after_warmup"] and w is not timing["first"]:
            mark = "  <- first window after the warm-up"
        lines.append(f"  steps {w['first_step']:>5}-{w['last_step']:<5} "
                     f"{w['median_ms']:>8.2f} / {w['p90_ms']:.2f}{mark}")
    first = timing["first_after_warmup"] or timing["first"]
    last = timing["last"]
    if first and last and first["median_ms"] > 0:
        lines.append(f"  last window / first window after the warm-up: "
                     f"{last['median_ms'] / first['median_ms']:.2f} "
                     "(median)")
    slowest_checks = max(report["check_seconds"].values())
    lines.append(f"reference checks took {slowest_checks:.1f} s on the "
                 "slowest rank (not in the step times)")
    lines.append("")
    failed = [name for name, c in checks.items() if not c["passed"]]
    lines.append("SOAK PASSED" if report["passed"] else
                 f"SOAK FAILED: {', '.join(failed)}")
    return "\n".join(lines)
