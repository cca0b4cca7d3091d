"""Turns README.md's Go example into a program, for //go:readme_test.

Usage: readme_example.py README.md QUICKSTART_MAIN_GO OUT_MAIN_GO

The example is the first ```go block under "## Using it from Go": the body
of a main function, run as written. It must be 10 lines, match the body of
go/examples/quickstart/main.go line for line, and use only the imports that
file has. Prints the output the README says it prints, one item a line.
"""
import re
import sys


def main() -> None:
    readme, quickstart, out = sys.argv[1:]
    text = open(readme, encoding="utf-8").read()
    section = text[text.index("## Using it from Go"):]
    match = re.search(r"```go\n(.*?)```\n(.*?)\n\n", section, re.S)
    if match is None:
        sys.exit("README.md: no ```go block under '## Using it from Go'")
    block = match.group(1).splitlines()
    if len(block) != 10:
        sys.exit(f"README.md: the Go example has {len(block)} lines, not 10")
    source = open(quickstart, encoding="utf-8").read()
    body = source[source.index("func main() {\n") + len("func main() {\n"):source.rindex("}")]
    if ["\t" + line if line else line for line in block] != body.splitlines():
        sys.exit("README.md's Go example differs from the body of main in "
                 "go/examples/quickstart/main.go")
    start = source.index("import (")
    imports = source[start:source.index(")\n", start) + 2]
    with open(out, "w", encoding="utf-8") as f:
        f.write("package main\n\n" + imports + "\nfunc main() {\n")
        f.write("".join(f"\t{line}\n" if line else "\n" for line in block))
        f.write("}\n")
    # What the README says it prints: `...` and `...` after the block.
    said = re.findall(r"prints\s+`([^`]*)`\s+and\s+`([^`]*)`", match.group(2))
    if not said:
        sys.exit("README.md: no 'prints `...` and `...`' after the Go example")
    print("\n".join(said[0]))


if __name__ == "__main__":
    main()
