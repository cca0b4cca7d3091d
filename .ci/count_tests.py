#!/usr/bin/python3
"""Counts test cases from a `bazel test` log and the test.xml files it names.

Prints "N passed, N failed[, N skipped]". A target Bazel reports as failed
without an XML file, and a build that failed before any test ran, count as one
failure each, so a broken build can never read as green.
"""
import os
import re
import sys
import xml.etree.ElementTree as ET

STATUS = re.compile(r"^(//\S+)\s+(?:\(cached\)\s+)?(PASSED|FAILED|TIMEOUT|FLAKY|NO STATUS|INCOMPLETE|FAILED TO BUILD)\b")


def xml_counts(target):
    path = os.path.join("bazel-testlogs", target.lstrip("/").replace(":", "/"), "test.xml")
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    suites = [root] if root.tag == "testsuite" else root.iter("testsuite")
    tests = failed = skipped = 0
    for suite in suites:
        tests += int(suite.get("tests", 0)) - int(suite.get("disabled", 0))
        failed += int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        skipped += sum(1 for case in suite.iter("testcase") if case.find("skipped") is not None)
    return tests, failed, skipped


def main(log_path):
    passed = failed = skipped = 0
    targets = 0
    with open(log_path, errors="replace") as log:
        text = log.read()
    for line in text.splitlines():
        m = STATUS.match(line)
        if not m:
            continue
        targets += 1
        target, status = m.group(1), m.group(2)
        counts = xml_counts(target) if status in ("PASSED", "FAILED", "FLAKY") else None
        if counts is None or counts[0] == 0:
            if status == "PASSED":
                passed += 1
            else:
                failed += 1
            continue
        tests, bad, skip = counts
        if status != "PASSED" and bad == 0:
            bad = 1  # the binary failed outside any test case
        passed += max(0, tests - bad - skip)
        failed += bad
        skipped += skip
    if targets == 0 or "FAILED: Build did NOT complete" in text:
        failed += 1
    line = f"{passed} passed, {failed} failed"
    if skipped:
        line += f", {skipped} skipped"
    print(line)


if __name__ == "__main__":
    main(sys.argv[1])
