"""Doxygen's input filter for the headers: their `//` comments read as documentation comments.

`// text` above a declaration becomes `/// text`, `member;  // text` becomes `member;  ///< text`, and the
comments' backslashes and at-signs stay text instead of Doxygen commands. Usage: doxygen_filter.py FILE.
"""

import re
import sys


def doc_comments(text):
    """Reads the headers' `//` comments as Doxygen's: `///` above a declaration, `///<` after a member."""
    lines = []
    for line in text.splitlines():
        if re.match(r"^\s*// ", line) or re.match(r"^\s*//$", line):
            line = re.sub(r"^(\s*)//", r"\1///", line, count=1)
        elif re.match(r"^\s*[^/\s].*[;,{]\s+// ", line) and "\"" not in line:
            line = re.sub(r"\s// ", " ///< ", line, count=1)
        # Doxygen reads `\name` and `@name` in documentation as commands; the comments mean them as text.
        if "///" in line:
            head, tail = line.split("///", 1)
            line = head + "///" + tail.replace("\\", "\\\\").replace("@", "\\@")
        lines.append(line)
    if lines and lines[0].startswith("///"):
        lines.insert(0, "/// \\file")  # the comment that opens a header describes the file
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as source:
        sys.stdout.write(doc_comments(source.read()))
