#!/usr/bin/python3
"""Prints `go test -json` output as text and writes it as JUnit XML.

    gotest_junit.py EVENTS.json [XML_OUT]

One <testcase> per Go test (subtests included), one <testsuite> per package,
so CI counts Go tests one by one; a package that fails outside any test
(a build error, a panic in TestMain) is one failed test case named after it.
"""
import json
import sys
import xml.etree.ElementTree as ET


def main(events_path, xml_path=None):
    packages = {}  # package -> {"tests": {name: case}, "action": ..., "output": [...]}
    with open(events_path, errors="replace") as f:
        for line in f:
            try:
                e = json.loads(line)
            except ValueError:
                sys.stdout.write(line)
                continue
            pkg = packages.setdefault(e.get("Package", "?"), {"tests": {}, "action": None, "output": []})
            test, action = e.get("Test"), e.get("Action")
            if action == "output":
                sys.stdout.write(e.get("Output", ""))
                target = pkg["tests"].setdefault(test, {"output": [], "action": None, "time": 0.0}) if test else pkg
                target["output"].append(e.get("Output", ""))
            elif action in ("pass", "fail", "skip"):
                if test:
                    case = pkg["tests"].setdefault(test, {"output": [], "action": None, "time": 0.0})
                    case["action"], case["time"] = action, e.get("Elapsed", 0.0)
                else:
                    pkg["action"] = action
    sys.stdout.flush()
    if not xml_path:
        return
    root = ET.Element("testsuites")
    for name, pkg in sorted(packages.items()):
        cases = dict(pkg["tests"])
        if pkg["action"] == "fail" and not any(c["action"] == "fail" for c in cases.values()):
            cases[name] = {"output": pkg["output"], "action": "fail", "time": 0.0}
        suite = ET.SubElement(root, "testsuite", name=name, tests=str(len(cases)),
                              failures=str(sum(c["action"] != "pass" and c["action"] != "skip"
                                               for c in cases.values())), errors="0")
        for test, c in sorted(cases.items()):
            case = ET.SubElement(suite, "testcase", classname=name, name=test, time=f"{c['time']:.3f}")
            if c["action"] == "skip":
                ET.SubElement(case, "skipped")
            elif c["action"] != "pass":
                failure = ET.SubElement(case, "failure", message=c["action"] or "did not finish")
                failure.text = "".join(c["output"])[-10000:]
    ET.ElementTree(root).write(xml_path, encoding="utf-8", xml_declaration=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
