#!/usr/bin/python3
"""Turns bench/e2e's JSON into PNG plots and markdown tables.

    bench/report.py results.json --out bench/results      # plots + tables.md
    bench/report.py results.json --results-md bench/RESULTS.md
    bench/report.py results.json --check                  # is the report complete?

--results-md rewrites the part of RESULTS.md between the markers
<!-- tables:begin --> and <!-- tables:end --> with the tables, and leaves the
hand-written analysis around them alone. The sparse, hosts and bindings
groups have their own markers (<!-- sparse:begin --> and <!-- sparse:end -->,
likewise hosts and bindings), so a run of one part (`e2e --only=sparse`)
updates that part and leaves the others as they are: a section is rewritten
only when the report has results for it (a group whose markers are missing
goes to the tables section).

Dense results carry the CPU seconds (client plus servers) per GB moved, shown
as a column; hosts results their share of linear scaling and of the links'
line rate. A group the run
skipped (hosts without root) is listed with the reason and does not make the
report incomplete.
"""
import argparse
import json
import os
import sys

GROUPS = ["ceiling", "dense", "latency", "optimizer", "embedded", "checkpoint", "memory", "scaling",
          "sparse", "hosts", "compression", "tls", "replication", "elastic", "bindings"]
# Groups a --quick run leaves out (bindings builds the Go driver first).
NOT_QUICK = {"bindings"}
# Groups with a section of their own in RESULTS.md (<!-- NAME:begin --> ...);
# the others go to the "tables" section.
OWN_SECTIONS = ["sparse", "hosts", "bindings"]
# Extra values shown as columns of their own, not in the extra column.
CPU_KEY = "cpu_s_per_GB"
SPARSE_NAMES = ["ceiling_pull", "ceiling_push", "pull", "push", "embedded_pull", "embedded_push",
                "pull_async", "push_async", "embedded_pull_async", "embedded_push_async"]


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


def skipped_groups(report):
    """{group: why} of the groups the run skipped."""
    return dict(s.split(": ", 1) if ": " in s else (s, "") for s in report.get("skipped", []))


def check(report):
    """Exit non-zero unless every group is present (or skipped, saying why) with sane values."""
    problems = []
    seen = {r["group"] for r in report["results"]}
    skipped = skipped_groups(report)
    for group, why in sorted(skipped.items()):
        print(f"group {group} skipped: {why}")
    for group in GROUPS:
        if group not in seen and group not in skipped and not (report.get("quick") and group in NOT_QUICK):
            problems.append(f"group {group} missing")
    sparse_names = {r["name"] for r in report["results"] if r["group"] == "sparse"}
    if "sparse" in seen:
        for name in SPARSE_NAMES:
            if name not in sparse_names:
                problems.append(f"sparse/{name} missing")
    if "dense" in seen:
        for r in report["results"]:
            if (r["group"] == "dense" and r["name"] in ("push", "pull", "pushpull")
                    and not r["extra"].get(CPU_KEY, 0) > 0):
                problems.append(f"dense/{r['name']} {fmt_bytes(r['payload_bytes'])}: no {CPU_KEY}")
    for r in report["results"]:
        if r["group"] == "hosts":
            for key in HOSTS_LINK_KEYS:
                if not r["extra"].get(key, 0) > 0:
                    problems.append(f"hosts/{r['name']} {r.get('servers', 0)} servers: no {key}")
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


def markdown_table(header, rows):
    """A markdown table: `header` and each of `rows` are lists of cells."""
    return (["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            + ["| " + " | ".join(cells) + " |" for cells in rows])


def sparse_transport(name):
    """(transport, op) of a sparse result: embedded_pull, ceiling_push, pull, pull_async, ..."""
    name = name.removesuffix("_async")  # k calls in flight: extra["in_flight"] says k
    for prefix, transport in (("embedded_", "embedded"), ("ceiling_", "ceiling")):
        if name.startswith(prefix):
            return transport, name[len(prefix):]
    return "gRPC", name


def sparse_table(rows):
    """The sparse group: one row per (op, transport, servers x workers, dim, batch)."""
    def cells(r):
        v = r["value"]
        transport, op = sparse_transport(r["name"])
        ratio = f"{100 * r['ratio']:.0f}%" if r.get("ceiling") else ""
        cpu = r["extra"].get("client_cpu_ns_per_key")
        return [op, transport, str(r.get("servers", 0)), str(r.get("workers", 0)),
                f"{r['extra'].get('dim', 0):.0f}", f"{r['extra'].get('batch_keys', 0):.0f}",
                f"{r['extra'].get('in_flight', 1):.0f}",
                *(f"{v[k] / 1e6:.2f}" for k in ("min", "median", "max")),
                f"{r['extra'].get('payload_GBps', 0):.3f} GB/s", ratio,
                f"{cpu:.0f}" if cpu is not None else ""]
    return markdown_table(["op", "transport", "servers", "workers", "dim", "keys per op",
                           "calls in flight", "min", "median", "max", "median payload",
                           "vs ceiling", "client CPU ns/key"],
                          [cells(r) for r in rows])


HOSTS_LINK_KEYS = ["payload_of_line", "server_link_in", "server_link_out", "server_link_min",
                   "worker_link_in", "worker_link_out"]


def hosts_table(rows):
    """The hosts group: aggregate push+pull per servers x workers, % of linear and % of line.

    "% of line" is the payload (counted once) against what the servers' links carry each
    way; the link columns are each link's wire bytes (headers included, as tbf counts
    them) per second against its rate, over the measured rounds: servers' links in / out
    (mean, and the least busy direction of any server), workers' links in / out (mean)."""
    def pct(r, key):
        return f"{100 * r['extra'][key]:.0f}%" if key in r["extra"] else "-"

    def cells(r):
        v = r["value"]
        e = r["extra"]
        return [str(r.get("servers", 0)), str(r.get("workers", 0)), fmt_bytes(r["payload_bytes"]),
                f"{e.get('link_mbit', 0):.0f} Mbit/s",
                *(f"{v[k]:.3f}" for k in ("min", "median", "max")),
                f"{100 * r.get('ratio', 0):.0f}%", pct(r, "payload_of_line"),
                f"{pct(r, 'server_link_in')} / {pct(r, 'server_link_out')} "
                f"(min {pct(r, 'server_link_min')})",
                f"{pct(r, 'worker_link_in')} / {pct(r, 'worker_link_out')}",
                f"{e['dropped_packets']:.0f}" if "dropped_packets" in e else "-",
                f"{100 * e.get('machine_cpu_busy', 0):.0f}%"]
    return markdown_table(["servers", "workers", "payload", "link (each host)", "min", "median",
                           "max", "% of linear", "payload % of line",
                           "server links in / out, % of line", "worker links in / out",
                           "drops", "machine CPU busy"], [cells(r) for r in rows])


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
        if group == "hosts":
            lines.append("### hosts (GB/s push+pull, all workers; every host in its own network "
                         "namespace, each link limited by tc tbf)")
            lines.append("")
            lines.extend(hosts_table(rows))
            lines.append("")
            continue
        cpu = any(CPU_KEY in r["extra"] for r in rows)
        lines.append(f"### {group}")
        lines.append("")
        lines.append("| name | payload | servers | workers | min | median | max | unit | vs ceiling | "
                     + ("CPU s/GB | " if cpu else "") + "extra |")
        lines.append("|---|---|---|---|---|---|---|---|---|" + ("---|" if cpu else "") + "---|")
        for r in rows:
            v = r["value"]
            ratio = f"{100 * r['ratio']:.0f}% of {r['ceiling']}" if r.get("ceiling") else ""
            extra = ", ".join(f"{k}={val:.1f}" for k, val in sorted(r["extra"].items()) if k != CPU_KEY)
            cpu_cell = f"{r['extra'][CPU_KEY]:.2f} | " if CPU_KEY in r["extra"] else ("| " if cpu else "")
            lines.append(
                f"| {r['name']} | {fmt_bytes(r.get('payload_bytes', 0))} | {r.get('servers', 0) or ''} "
                f"| {r.get('workers', 0) or ''} | {v['min']:.3f} | {v['median']:.3f} | {v['max']:.3f} "
                f"| {r['unit']} | {ratio} | {cpu_cell}{extra} |")
        lines.append("")
    for group, why in sorted(skipped_groups(report).items()):
        if groups is None or group in groups:
            lines.append(f"### {group}: skipped ({why})")
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
        made.append(finish_plot(plt, fig, ax, os.path.join(out_dir, "scaling.png"),
                                "servers (processes)", "GB/s (push+pull)",
                                f"scaling, {fmt_bytes(scaling[0]['payload_bytes'])} push+pull"))

    hosts = [r for r in results if r["group"] == "hosts"]
    if hosts:
        made.append(hosts_plot(plt, hosts, out_dir))

    sparse = [r for r in results if r["group"] == "sparse"]
    if sparse:
        made.append(sparse_plot(plt, sparse, out_dir))
    return made


def hosts_plot(plt, rows, out_dir):
    """Aggregate push+pull against servers, with linear scaling from 1 server."""
    pts = sorted((r["servers"], r["value"]) for r in rows)
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [p[0] for p in pts]
    ax.errorbar(xs, [p[1]["median"] for p in pts],
                yerr=[[p[1]["median"] - p[1]["min"] for p in pts],
                      [p[1]["max"] - p[1]["median"] for p in pts]],
                marker="o", capsize=3, label="measured")
    one = [p[1]["median"] for p in pts if p[0] == 1]
    if one:
        ax.plot(xs, [one[0] * x for x in xs], "k--", label="linear from 1 server")
    return finish_plot(plt, fig, ax, os.path.join(out_dir, "hosts.png"),
                       "servers (each with its own namespace and link)",
                       "GB/s (push+pull, all workers)",
                       f"hosts, {rows[0]['extra'].get('link_mbit', 0):.0f} Mbit/s tbf links, "
                       f"{fmt_bytes(rows[0]['payload_bytes'])}")


def finish_plot(plt, fig, ax, path, xlabel, ylabel, title):
    """Labels, grid and legend on `ax`; saves `fig` to `path` and returns it."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def sparse_plot(plt, rows, out_dir):
    """Median keys/s per (dim, batch), one bar per transport and servers x workers."""
    cases = sorted({(int(r["extra"]["dim"]), int(r["extra"]["batch_keys"])) for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    for ax, op in zip(axes, ("pull", "push")):
        series = sorted({(r["name"], r["servers"], r["workers"]) for r in rows
                         if r["name"] in (op, f"embedded_{op}", f"ceiling_{op}")},
                        key=lambda s: (not s[0].startswith("ceiling_"), s[0].startswith("embedded_"),
                                       s[1], s[2]))  # the ceiling, then gRPC
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
            transport = sparse_transport(name)[0]
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
        skipped = skipped_groups(report)
        complete = all(g in present or g in skipped or (report.get("quick") and g in NOT_QUICK)
                       for g in GROUPS)
        name = "tables.md" if complete else f"tables_{'_'.join(present)}.md"
        with open(os.path.join(args.out, name), "w") as f:
            f.write(text + "\n")
        print("wrote", os.path.join(args.out, name))
    if args.results_md:
        with open(args.results_md) as f:
            doc = f.read()
        # Each section is rewritten only when this report has results for it.
        own = [g for g in OWN_SECTIONS if g in present and f"<!-- {g}:begin -->" in doc]
        sections = [(g, [g]) for g in own]
        rest = [g for g in present if g not in own]
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
