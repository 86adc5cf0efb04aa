"""Fails when a doctest case name holds a ';' (run by ctest).

doctest_discover_tests reads the names into a CMake list, so a ';' splits one case into
two ctest tests whose names match no case: both "pass" having run nothing. Names are the
string literals after TEST_CASE( (adjacent literals joined), in every tests/**/*.cpp.
"""
import pathlib
import re
import sys

CASE = re.compile(r'\bTEST_CASE(?:_TEMPLATE)?\(\s*((?:"(?:[^"\\\n]|\\.)*"\s*)+)')
LITERAL = re.compile(r'"((?:[^"\\\n]|\\.)*)"')


def main() -> int:
    root = pathlib.Path(__file__).resolve().parent
    bad = []
    for path in sorted(root.rglob("*.cpp")):
        text = path.read_text(encoding="utf-8", errors="replace")
        for m in CASE.finditer(text):
            name = "".join(LITERAL.findall(m.group(1)))
            if ";" in name:
                line = text.count("\n", 0, m.start()) + 1
                bad.append(f"{path.relative_to(root.parent)}:{line}: test case name holds ';': {name}")
    for b in bad:
        print(b)
    if bad:
        print(f"{len(bad)} test case(s) that ctest would split and never run; use ',' instead of ';'")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
