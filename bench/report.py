#!/usr/bin/python3
"""Turns bench/e2e's JSON into PNG plots and markdown tables.

    bench/report.py results.json --out bench/results      # plots + tables.md
    bench/report.py results.json --results-md bench/RESULTS.md
    bench/report.py results.json --check                  # is the report complete?

--results-md rewrites the part of RESULTS.md between the markers
<!-- tables:begin --> and <!-- tables:end --> with the tables, and leaves the
hand-written analysis around them alone. The sparse and bindings groups have
their own markers (<!-- sparse:begin --> and <!-- sparse:end -->, likewise
bindings), so a run of one part (`e2e --only=sparse`) updates that part and
leaves the others as they are: a section is rewritten only when the report
has results for it.
"""
import argparse
import json
import os
import sys

GROUPS = ["ceiling", "dense", "latency", "optimizer", "embedded", "checkpoint", "memory", "scaling",
          "sparse", "compression", "bindings"]
# Groups a --quick run leaves out (bindings builds the Go driver first).
NOT_QUICK = {"bindings"}
# Groups with a section of their own in RESULTS.md (<!-- NAME:begin --> ...);
# the others go to the "tables" section.
OWN_SECTIONS = ["sparse", "bindings"]
SPARSE_NAMES = ["pull", "push", "embedded_pull", "embedded_push"]


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
        if group not in seen and not (report.get("quick") and group in NOT_QUICK):
            problems.append(f"group {group} missing")
    sparse_names = {r["name"] for r in report["results"] if r["group"] == "sparse"}
    if "sparse" in seen:
        for name in SPARSE_NAMES:
            if name not in sparse_names:
                problems.append(f"sparse/{name} missing")
    for r in report["results"]:
        v = r["value"]
        if not (v.get("min", 0) > 0 and v["min"] <= v["median"] <= v["max"]):
            problems.append(f"{r['group']}/{r['name']} {fmt_bytes(r.get('payload_bytes', 0))}: bad stats {v}")
    if problems:
        print("\n".join(problems))
        return 1
    print(f"report complete: {len(report['results'])} results in {len(seen)} groups")
    return 0


def groups_in(report):
    seen = {r["group"] for r in report["results"]}
    return [g for g in GROUPS if g in seen]


def sparse_table(rows):
    """The sparse group: one row per (op, transport, servers x workers, dim, batch)."""
    lines = ["| op | transport | servers | workers | dim | keys per op | min | median | max | "
             "median payload |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        v = r["value"]
        transport, op = (("embedded", r["name"][len("embedded_"):]) if r["name"].startswith("embedded_")
                         else ("gRPC", r["name"]))
        mkeys = lambda x: f"{x / 1e6:.2f}"
        lines.append(
            f"| {op} | {transport} | {r.get('servers', 0)} | {r.get('workers', 0)} "
            f"| {r['extra'].get('dim', 0):.0f} | {r['extra'].get('batch_keys', 0):.0f} "
            f"| {mkeys(v['min'])} | {mkeys(v['median'])} | {mkeys(v['max'])} "
            f"| {r['extra'].get('payload_GBps', 0):.3f} GB/s |")
    return lines


def tables(report, groups=None):
    """Markdown tables of `groups` (default: every group in the report)."""
    lines = [f"Machine: {report['machine']}  ", f"Command: `{report['command']}`  ",
             f"Date: {report['date']}{' (quick run)' if report.get('quick') else ''}", ""]
    for group in groups if groups is not None else GROUPS:
        rows = [r for r in report["results"] if r["group"] == group]
        if not rows:
            continue
        if group == "sparse":
            lines.append("### sparse (M keys/s; keys uniform over 1M keys)")
            lines.append("")
            lines.extend(sparse_table(rows))
            lines.append("")
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
        if not ax.lines and not ax.containers:  # no results of this kind in the report
            plt.close(fig)
            return
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

    sparse = [r for r in results if r["group"] == "sparse"]
    if sparse:
        made.append(sparse_plot(plt, sparse, out_dir))
    return made


def sparse_plot(plt, rows, out_dir):
    """Median keys/s per (dim, batch), one bar per transport and servers x workers."""
    cases = sorted({(int(r["extra"]["dim"]), int(r["extra"]["batch_keys"])) for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    for ax, op in zip(axes, ("pull", "push")):
        series = sorted({(r["name"], r["servers"], r["workers"]) for r in rows
                         if r["name"] in (op, f"embedded_{op}")},
                        key=lambda s: (s[0].startswith("embedded_"), s[1], s[2]))  # gRPC first
        width = 0.8 / max(1, len(series))
        for i, (name, servers, workers) in enumerate(series):
            values = {}
            for r in rows:
                if (r["name"], r["servers"], r["workers"]) == (name, servers, workers):
                    values[(int(r["extra"]["dim"]), int(r["extra"]["batch_keys"]))] = r["value"]
            xs = [c + (i - (len(series) - 1) / 2) * width for c in range(len(cases))]
            meds = [values[c]["median"] / 1e6 if c in values else 0 for c in cases]
            err = [[(values[c]["median"] - values[c]["min"]) / 1e6 if c in values else 0 for c in cases],
                   [(values[c]["max"] - values[c]["median"]) / 1e6 if c in values else 0 for c in cases]]
            transport = "embedded" if name.startswith("embedded_") else "gRPC"
            ax.bar(xs, meds, width, yerr=err, capsize=2, label=f"{transport} {servers}s x {workers}w")
        ax.set_xticks(range(len(cases)))
        ax.set_xticklabels([f"dim {d}\n{b} keys" for d, b in cases])
        ax.set_title(f"sparse {op}")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("M keys/s (all workers)")
    path = os.path.join(out_dir, "sparse.png")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def rewrite_section(doc, name, text):
    """`doc` with the part between <!-- name:begin --> and <!-- name:end -->
    replaced by `text`; None if the markers are missing."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    if begin not in doc or end not in doc:
        return None
    head, rest = doc.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{text}\n{end}{tail}"


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
    present = groups_in(report)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        for path in plots(report, args.out):
            print("wrote", path)
        # A partial run (--only) gets its own file, so the full run's stays.
        complete = all(g in present or (report.get("quick") and g in NOT_QUICK) for g in GROUPS)
        name = "tables.md" if complete else f"tables_{'_'.join(present)}.md"
        with open(os.path.join(args.out, name), "w") as f:
            f.write(text + "\n")
        print("wrote", os.path.join(args.out, name))
    if args.results_md:
        with open(args.results_md) as f:
            doc = f.read()
        # Each section is rewritten only when this report has results for it.
        sections = [(g, [g]) for g in OWN_SECTIONS if g in present]
        rest = [g for g in present if g not in OWN_SECTIONS]
        if rest:
            sections.insert(0, ("tables", rest))
        for section, groups in sections:
            updated = rewrite_section(doc, section, tables(report, groups))
            if updated is None:
                print(f"{args.results_md} has no <!-- {section}:begin --> ... <!-- {section}:end --> "
                      "section", file=sys.stderr)
                return 1
            doc = updated
        with open(args.results_md, "w") as f:
            f.write(doc)
        print("updated", args.results_md, "sections:", ", ".join(s for s, _ in sections))
    if not args.out and not args.results_md:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
