"""Merges pserver trace files (Chrome trace / Perfetto JSON) onto one time line.

A worker records its calls with ``PSERVER_TRACE=worker.json`` (or the
client's ``trace_file`` option) and each server its request stages with
``--trace_file=server0.json``. Every file's timestamps are microseconds of
CLOCK_MONOTONIC, and its ``otherData`` holds the process's start on both the
monotonic and the wall clock (``start_monotonic_us``, ``start_unix_us``).

    python -m pserver.trace merge worker.json server0.json server1.json -o all.json

Files from one host share CLOCK_MONOTONIC and are merged as they are. Files
from different hosts (their wall-minus-monotonic offsets differ by more than
``--same_host_tolerance_us``, default one second) are shifted onto the first
file's time line by their wall clocks, which are only as close as NTP keeps
the hosts (typically within a millisecond). ``--align monotonic`` or
``--align wall`` forces either. Open the result in https://ui.perfetto.dev
or chrome://tracing.

Only the standard library is used: this module imports nothing else of
pserver.
"""
import argparse
import json
import sys
from typing import Iterable, List, Optional, Sequence

__all__ = ["load", "merge", "main"]


def load(path: str) -> dict:
    """The trace in `path`; ValueError naming the file when it is not a
    pserver trace (no traceEvents, or no clock data in otherData)."""
    with open(path) as f:
        try:
            trace = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not JSON: {e}") from None
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise ValueError(f"{path}: no traceEvents array")
    other = trace.get("otherData", {})
    for key in ("start_monotonic_us", "start_unix_us"):
        if not isinstance(other.get(key), (int, float)):
            raise ValueError(f"{path}: otherData.{key} missing: not a pserver trace")
    return trace


def _offset(trace: dict) -> float:
    other = trace["otherData"]
    return other["start_unix_us"] - other["start_monotonic_us"]


def merge(traces: Sequence[dict], align: str = "auto",
          same_host_tolerance_us: float = 1e6) -> dict:
    """One trace of every event of `traces`, on the first one's time line.

    align: "monotonic" keeps timestamps as they are (one host); "wall"
    shifts each trace by the difference of its wall-minus-monotonic offset
    from the first's; "auto" does that only for traces whose offset differs
    by more than `same_host_tolerance_us`. Processes with the same pid in
    different traces get distinct pids."""
    if align not in ("auto", "monotonic", "wall"):
        raise ValueError(f"align must be auto, monotonic or wall, not {align!r}")
    if not traces:
        raise ValueError("nothing to merge")
    base = _offset(traces[0])
    events: List[dict] = []
    used_pids = set()
    sources = []
    for n, trace in enumerate(traces):
        difference = _offset(trace) - base
        shift = 0.0
        if align == "wall" or (align == "auto" and abs(difference) > same_host_tolerance_us):
            shift = difference
        pids = {e.get("pid") for e in trace["traceEvents"]}
        remap = {}
        for pid in pids:
            new = pid
            while new in used_pids:
                new = (new if isinstance(new, int) else 0) + 1000000 * (n + 1)
            remap[pid] = new
        used_pids.update(remap.values())
        for e in trace["traceEvents"]:
            e = dict(e)
            if "ts" in e:
                e["ts"] = e["ts"] + shift
            e["pid"] = remap.get(e.get("pid"), e.get("pid"))
            events.append(e)
        sources.append({"process_name": trace["otherData"].get("process_name", ""),
                        "pid": remap.get(trace["otherData"].get("pid")),
                        "shift_us": shift,
                        "dropped_events": trace["otherData"].get("dropped_events", 0)})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"clock": "CLOCK_MONOTONIC of the first file", "merged": sources}}


def main(argv: Optional[Iterable[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pserver.trace", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    m = commands.add_parser("merge", help="merge trace files onto one time line")
    m.add_argument("files", nargs="+", help="trace files (the first sets the time line)")
    m.add_argument("-o", "--output", default="-", help="where to write (default: stdout)")
    m.add_argument("--align", choices=("auto", "monotonic", "wall"), default="auto")
    m.add_argument("--same_host_tolerance_us", type=float, default=1e6)
    args = parser.parse_args(None if argv is None else list(argv))
    try:
        merged = merge([load(p) for p in args.files], args.align, args.same_host_tolerance_us)
    except (OSError, ValueError) as e:
        print(f"pserver.trace: {e}", file=sys.stderr)
        return 2
    if args.output == "-":
        json.dump(merged, sys.stdout)
        sys.stdout.write("\n")
    else:
        with open(args.output, "w") as f:
            json.dump(merged, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
