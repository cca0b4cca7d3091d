#!/usr/bin/python3
"""Turns bench/e2e's JSON into PNG plots and markdown tables.

    bench/report.py results.json --out bench/results      # plots + tables.md
    bench/report.py results.json --results-md bench/RESULTS.md
    bench/report.py results.json --check                  # is the report complete?

--results-md rewrites the part of RESULTS.md between the markers
<!-- tables:begin --> and <!-- tables:end --> with the tables, and leaves the
hand-written analysis around them alone.
"""
import argparse
import json
import os
import sys

GROUPS = ["ceiling", "dense", "latency", "optimizer", "embedded", "checkpoint", "memory", "scaling"]


def fmt_bytes(n):
    n = int(n)
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B" if n else "-"


def load(path):
    with open(path) as f:
        report = json.load(f)
    for r in report.get("results", []):
        r.setdefault("value", {})
        r.setdefault("extra", {})
        # protobuf's JSON mapping writes 64-bit integers as strings.
        r["payload_bytes"] = int(r.get("payload_bytes", 0))
    return report


def check(report):
    """Exit non-zero unless every group is present with sane values."""
    problems = []
    seen = {r["group"] for r in report["results"]}
    for group in GROUPS:
        if group not in seen:
            problems.append(f"group {group} missing")
    for r in report["results"]:
        v = r["value"]
        if not (v.get("min", 0) > 0 and v["min"] <= v["median"] <= v["max"]):
            problems.append(f"{r['group']}/{r['name']} {fmt_bytes(r.get('payload_bytes', 0))}: bad stats {v}")
    if problems:
        print("\n".join(problems))
        return 1
    print(f"report complete: {len(report['results'])} results in {len(seen)} groups")
    return 0


def tables(report):
    lines = [f"Machine: {report['machine']}  ", f"Command: `{report['command']}`  ",
             f"Date: {report['date']}{' (quick run)' if report.get('quick') else ''}", ""]
    for group in GROUPS:
        rows = [r for r in report["results"] if r["group"] == group]
        if not rows:
            continue
        lines.append(f"### {group}")
        lines.append("")
        lines.append("| name | payload | servers | workers | min | median | max | unit | vs ceiling | extra |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            v = r["value"]
            ratio = f"{100 * r['ratio']:.0f}% of {r['ceiling']}" if r.get("ceiling") else ""
            extra = ", ".join(f"{k}={val:.1f}" for k, val in sorted(r["extra"].items()))
            lines.append(
                f"| {r['name']} | {fmt_bytes(r.get('payload_bytes', 0))} | {r.get('servers', 0) or ''} "
                f"| {r.get('workers', 0) or ''} | {v['min']:.3f} | {v['median']:.3f} | {v['max']:.3f} "
                f"| {r['unit']} | {ratio} | {extra} |")
        lines.append("")
    return "\n".join(lines)


def plots(report, out_dir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = report["results"]
    ceilings = {r["name"]: r for r in results if r["group"] == "ceiling"}
    made = []

    def throughput_plot(group, servers, workers, ceiling_names, filename, title):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for kind, marker in (("push", "o"), ("pull", "s"), ("pushpull", "^")):
            pts = sorted((r["payload_bytes"], r["value"]) for r in results
                         if r["group"] == group and r["name"] == kind
                         and r.get("servers", 0) == servers and r.get("workers", 0) == workers)
            if not pts:
                continue
            xs = [p[0] for p in pts]
            ax.errorbar(xs, [p[1]["median"] for p in pts],
                        yerr=[[p[1]["median"] - p[1]["min"] for p in pts],
                              [p[1]["max"] - p[1]["median"] for p in pts]],
                        marker=marker, capsize=3, label=kind)
        echo = sorted((r["payload_bytes"], r["value"]["median"]) for r in results
                      if r["group"] == "ceiling" and r["name"] == "grpc_echo")
        if echo and group == "dense":
            ax.plot([e[0] for e in echo], [e[1] for e in echo], "k:", label="raw gRPC echo (default)")
        for name, style in zip(ceiling_names, ("r--", "g--")):
            if name in ceilings:
                ax.axhline(ceilings[name]["value"]["median"], linestyle="--", color=style[0],
                           label=f"{name} ceiling")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("payload per operation (bytes)")
        ax.set_ylabel("GB/s")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        path = os.path.join(out_dir, filename)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made.append(path)

    configs = sorted({(r.get("servers", 0), r.get("workers", 0)) for r in results if r["group"] == "dense"})
    for s, w in configs:
        throughput_plot("dense", s, w, ["socket"], f"dense_{s}s{w}w.png",
                        f"dense push/pull over gRPC, {s} server(s) x {w} worker(s)")
    throughput_plot("embedded", 1, 1, ["memcpy"], "embedded.png",
                    "embedded in-process cluster (no sockets)")

    scaling = [r for r in results if r["group"] == "scaling"]
    if scaling:
        fig, ax = plt.subplots(figsize=(6, 4))
        for workers in sorted({r["workers"] for r in scaling}):
            pts = sorted((r["servers"], r["value"]["median"]) for r in scaling if r["workers"] == workers)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{workers} worker(s)")
        if "socket" in ceilings:
            ax.axhline(ceilings["socket"]["value"]["median"], linestyle="--", color="r", label="socket ceiling")
        ax.set_xlabel("servers (processes)")
        ax.set_ylabel("GB/s (push+pull)")
        ax.set_title(f"scaling, {fmt_bytes(scaling[0]['payload_bytes'])} push+pull")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        path = os.path.join(out_dir, "scaling.png")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made.append(path)
    return made


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json")
    parser.add_argument("--out", help="directory for the PNG plots and tables.md")
    parser.add_argument("--results-md", help="RESULTS.md whose tables section to rewrite")
    parser.add_argument("--check", action="store_true", help="only check the report is complete")
    args = parser.parse_args()
    report = load(args.json)
    if args.check:
        return check(report)
    text = tables(report)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        for path in plots(report, args.out):
            print("wrote", path)
        with open(os.path.join(args.out, "tables.md"), "w") as f:
            f.write(text + "\n")
    if args.results_md:
        with open(args.results_md) as f:
            doc = f.read()
        begin, end = "<!-- tables:begin -->", "<!-- tables:end -->"
        if begin not in doc or end not in doc:
            print(f"{args.results_md} has no {begin} ... {end} section", file=sys.stderr)
            return 1
        head, rest = doc.split(begin, 1)
        _, tail = rest.split(end, 1)
        with open(args.results_md, "w") as f:
            f.write(f"{head}{begin}\n{text}\n{end}{tail}")
        print("updated", args.results_md)
    if not args.out and not args.results_md:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
